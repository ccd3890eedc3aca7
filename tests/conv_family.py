"""A small convolutional backbone family for the tests: its own stem, options and blocks, no attention, no positions.

It enters as a family outside the tree does: a distribution whose entry point (group family.ENTRY_POINTS) names
CONV, found by importlib.metadata. `install` writes that distribution (its *.dist-info) into a folder; with the folder
and this one on sys.path (PYTHONPATH for a subprocess), the registry registers the family when it is first read.
It meets the family contract from its entry alone: conv stem -> depthwise-separable residual conv blocks on the
patch grid -> LayerNorm of the mean -> head. It offers a token grid and pre-logits, not attention maps or resizing,
so the figures and commands that need those say so. Of the shared options it reads patch_size, width, head and init.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vit_lightning.model import HEADS, ModelConfig
from vit_lightning.model.config import check_choice
from vit_lightning.model.family import ENTRY_POINTS, PRE_LOGITS, TOKEN_GRID, BackboneParts, Family, Option
from vit_lightning.model.layers import INITS, lecun_normal_

NAME = "conv"
DISTRIBUTION = "vit_lightning_conv_family-0.1"  # the test distribution's name and version, as its folder spells them
CONV_VARIANTS = {"micro": (32, 2)}  # name: (width, blocks)
CONV_OPTIONS = {"kernel_size": Option(3, int, "conv: side of the depthwise kernels of its blocks (odd).")}


class ConvStem(nn.Module):
    """A 3x3 conv, GroupNorm and GELU at full resolution, then a P x P conv of stride P: (B, C, H, W) -> (B, D, H/P, W/P)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.patch_size, hidden = cfg.patch_size, max(1, cfg.width // 2)
        self.local = nn.Conv2d(cfg.in_chans, hidden, 3, padding=1)
        self.norm = nn.GroupNorm(1, hidden)
        self.down = nn.Conv2d(hidden, cfg.width, cfg.patch_size, stride=cfg.patch_size)

    def init_weights(self, init: str) -> None:
        """`paper`: lecun_normal kernels and zero biases, as the ViT's patch embedding; `timm`: PyTorch's conv init."""
        if init == "paper":
            for conv in (self.local, self.down):
                lecun_normal_(conv.weight)
                nn.init.zeros_(conv.bias)

    def grid_for(self, img_size: tuple[int, int]) -> tuple[int, int]:
        if any(side % self.patch_size for side in img_size):
            raise ValueError(f"image size {img_size} is not divisible by patch_size={self.patch_size}")
        return img_size[0] // self.patch_size, img_size[1] // self.patch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.grid_for(tuple(x.shape[-2:]))  # the stride would drop a remainder silently
        return self.down(nn.functional.gelu(self.norm(self.local(x))))  # (B, D, H', W')


class ConvBlock(nn.Module):
    """x + pointwise(GELU(GroupNorm(depthwise(x)))) on a (B, D, H, W) map."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.norm = nn.GroupNorm(1, dim)
        self.pointwise = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pointwise(nn.functional.gelu(self.norm(self.depthwise(x))))


class ConvNet(BackboneParts, nn.Module):
    """The conv family's backbone; options as ModelConfig with arch='conv' and its own kernel_size."""

    def __init__(self, variant: str = "micro", **options):
        super().__init__()
        self.config = cfg = ModelConfig(**{**options, "arch": NAME, "variant": variant})
        self.stem = ConvStem(cfg)
        self.stem.init_weights(cfg.init)
        self.blocks = nn.ModuleList(ConvBlock(cfg.width, cfg.kernel_size) for _ in range(CONV_VARIANTS[variant][1]))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = HEADS[cfg.head](cfg.width, cfg.num_classes, cfg.init)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # (B, D, H', W')
        for block in self.blocks:
            x = block(x)
        return self.norm(x.mean(dim=(2, 3)))  # (B, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def no_weight_decay(self) -> set[str]:
        return set()


def check_conv(cfg: ModelConfig) -> None:
    """The conv family's own checks: its kernel, its init, the variant's width."""
    if isinstance(cfg.kernel_size, bool) or not isinstance(cfg.kernel_size, int) or cfg.kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be an odd number of pixels, got {cfg.kernel_size!r}")
    check_choice("init", cfg.init, INITS)
    cfg.width = cfg.width or CONV_VARIANTS[cfg.variant][0]
    cfg.check_positive("img_size", "in_chans", "num_classes", "patch_size", "width", "kernel_size")


CONV = Family(name=NAME, cls=ConvNet, variants=CONV_VARIANTS, encodings=("none",),
              defaults={"pooling": "gap", "pos_encoding": "none", "patch_size": 4, "init": "paper"},
              reads=frozenset({"patch_size", "width", "head", "init"}),
              options=CONV_OPTIONS, architecture=("kernel_size",), demo_patch=4, check=check_conv,
              offers=frozenset({TOKEN_GRID, PRE_LOGITS}))


def install(site: Path, entry: str = f"{NAME} = {__name__}:CONV", name: str = DISTRIBUTION) -> Path:
    """Write a distribution whose one entry point (`entry`, in ENTRY_POINTS) names a family into `site`; `site`."""
    info = site / f"{name}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    project, version = name.rsplit("-", 1)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\n{entry}\n")
    return site
