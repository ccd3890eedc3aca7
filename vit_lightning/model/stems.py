"""Stems: image (B, C, H, W) -> patch tokens (B, N, D) on an (H', W') grid.

Every stem is built as `Stem(cfg)` from a ModelConfig and owns the patch size: `grid_for(img_size)`
says which token grid an input size gives.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.model.flexi import pi_resize
from vit_lightning.model.layers import lecun_normal_


class PatchStem(nn.Module):
    """Non-overlapping P x P patches, linearly projected (a P x P convolution with stride P)."""

    def __init__(self, cfg):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.proj = nn.Conv2d(cfg.in_chans, cfg.width, cfg.patch_size, stride=cfg.patch_size)

    def init_weights(self, init: str) -> None:
        """`paper`: lecun_normal embedding kernel, zero bias (vit_jax); `timm` keeps PyTorch's conv init."""
        if init == "paper":
            lecun_normal_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    def grid_for(self, img_size: tuple[int, int]) -> tuple[int, int]:
        p = self.patch_size
        for side in img_size:
            if side % p:
                divisors = [d for d in range(1, side + 1) if side % d == 0]
                raise ValueError(f"image size {side} is not divisible by patch_size={p}; valid patch sizes: {divisors}")
        return img_size[0] // p, img_size[1] // p

    @torch.no_grad()
    def resize_patch(self, patch_size: int) -> None:
        """Another patch size: the kernel PI-resized (FlexiViT), the bias kept."""
        weight = pi_resize(self.proj.weight, (patch_size, patch_size))
        proj = nn.Conv2d(self.proj.in_channels, self.proj.out_channels, patch_size, stride=patch_size)
        proj.weight.copy_(weight)
        proj.bias.copy_(self.proj.bias)
        self.proj, self.patch_size = proj.to(weight.device), patch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tokens_of(self.proj(x))  # (B, N, D)


def tokens_of(grid: torch.Tensor) -> torch.Tensor:
    """(B, D, H, W) conv output -> contiguous (B, N, D) tokens.

    The transposed view keeps the conv's channel-major layout, and elementwise ops keep their input's layout:
    without a [class] token's concatenation to copy it, the residual stream would stay strided through every
    block (each LayerNorm copying it, each residual add reading it across), 11-17% of a GAP or MAP step on a GPU.
    """
    return grid.flatten(2).transpose(1, 2).contiguous()


def _pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TensorFlow 'SAME' padding: output size ceil(input / stride), extra pixel at the end."""
    pads = []
    for size in reversed(x.shape[-2:]):
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value)


class StdConv2d(nn.Conv2d):
    """Convolution with weight standardization and 'SAME' padding (BiT)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, eps: float = 1e-8):
        super().__init__(cin, cout, kernel, stride=stride, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
        w = (w - mean) / torch.sqrt(var + self.eps)
        return F.conv2d(_pad_same(x, self.kernel_size[0], self.stride[0]), w, stride=self.stride)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-5)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride in the 3x3) with GroupNorm, ReLU after the residual sum."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        mid = cout // 4
        self.conv1, self.norm1 = StdConv2d(cin, mid, 1), _norm(mid)
        self.conv2, self.norm2 = StdConv2d(mid, mid, 3, stride), _norm(mid)
        self.conv3, self.norm3 = StdConv2d(mid, cout, 1), _norm(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(StdConv2d(cin, cout, 1, stride), _norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        return F.relu(self.norm3(self.conv3(y)) + shortcut)


class HybridStem(nn.Module):
    """BiT-style ResNet feature extractor, then 1 x 1 "patches" projected to tokens (section 3.1).

    `hybrid_layers` blocks per stage; the default (3, 4, 9) is the paper's R50 with stage 4 folded
    into stage 3 (stride 16). `hybrid_width` is the root width (64 in R50; a multiple of 32).
    The ResNet's stride plays the role of the patch size, so `patch_size` does not apply here.
    """

    def __init__(self, cfg):
        super().__init__()
        width, layers = cfg.hybrid_width, tuple(cfg.hybrid_layers)
        self.root = nn.Sequential(StdConv2d(cfg.in_chans, width, 7, 2), _norm(width), nn.ReLU())
        stages, cin = [], width
        for i, depth in enumerate(layers):
            cout = 4 * width * 2**i
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(*(Bottleneck(cin if b == 0 else cout, cout, stride if b == 0 else 1) for b in range(depth))))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.proj = nn.Conv2d(cin, cfg.width, 1)
        self.patch_size = 4 * 2 ** (len(layers) - 1)  # effective stride in pixels

    def init_weights(self, init: str) -> None:
        """`paper`: flax's default lecun_normal for every conv, zero projection bias; `timm` keeps PyTorch's."""
        if init == "paper":
            for conv in self.modules():
                if isinstance(conv, nn.Conv2d):
                    lecun_normal_(conv.weight)
            nn.init.zeros_(self.proj.bias)

    def grid_for(self, img_size: tuple[int, int]) -> tuple[int, int]:
        halvings = 2 + len(self.stages) - 1  # root conv, max-pool, then every stage after the first
        grid = list(img_size)
        for _ in range(halvings):
            grid = [math.ceil(side / 2) for side in grid]
        return grid[0], grid[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.root(x)
        x = F.max_pool2d(_pad_same(x, 3, 2, value=float("-inf")), 3, stride=2)
        x = self.stages(x)
        return tokens_of(self.proj(x))  # (B, N, D)


STEMS: dict[str, type[nn.Module]] = {"patch": PatchStem, "hybrid": HybridStem}
