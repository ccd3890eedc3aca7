"""The Swin Transformer (Liu et al., ICCV 2021): patch stem -> stages of window-attention blocks -> LN + GAP -> head.

Each stage after the first starts with a patch merging (2x2 neighbours concatenated, LayerNorm, 4C -> 2C).
Blocks alternate regular windows (W-MSA) and windows shifted by M // 2 (SW-MSA); the shift is a cyclic
roll of the map, with a mask that keeps tokens wrapped in from the far side out of each other's attention.
Attention, MLP, the relative-bias table, the absolute table, pooling and heads are the ViT's parts.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.model.config import ModelConfig, check_choice
from vit_lightning.model.family import (
    ATTENTION_MAPS,
    PRE_LOGITS,
    TOKEN_GRID,
    BackboneParts,
    BlockAttention,
    Family,
    Option,
    register,
)
from vit_lightning.model.from_timm.swin import load_timm_swin, timm_swin_reference
from vit_lightning.model.layers import (
    INITS,
    Attention,
    DropPath,
    Mlp,
    drop_path_rates,
    init_dense,
    layer_scale,
    lecun_normal_,
)
from vit_lightning.model.naming import EARLIER, NamePart
from vit_lightning.model.pooling import HEADS, POOLINGS
from vit_lightning.model.position import Learned1d, RelativeBias2d
from vit_lightning.model.stems import PatchStem

# Swin name: (width C of stage 1, blocks per stage, heads per stage); the Swin paper's section 3.3 plus a CPU
# demo size (two stages: 14x14 then 7x7 tokens for 28x28 digits in patches of 2)
SWIN_VARIANTS: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]] = {
    "micro": (32, (2, 2), (2, 4)),
    "T": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
    "S": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
    "B": (128, (2, 2, 18, 2), (4, 8, 16, 32)),
    "L": (192, (2, 2, 18, 2), (6, 12, 24, 48)),
}

# Swin's position choices (its Table 4): name -> (absolute table after the patch embedding, relative bias)
SWIN_ENCODINGS: dict[str, tuple[bool, bool]] = {
    "none": (False, False),
    "learned_1d": (True, False),
    "relative_bias_2d": (False, True),
    "learned_1d+relative_bias_2d": (True, True),
}

# The Swin paper's init (and its reference code's) is `model.init=timm`, Swin's default: trunc_normal(0.02) dense
# kernels and zero biases (layers.init_dense); the patch embedding keeps PyTorch's fan-in init, LayerNorms ones and
# zeros, the position tables their normal(0.02). `model.init=paper` is the ViT paper's fan-in-scaled init instead
# (xavier_uniform attention and MLP kernels, lecun_normal patch embedding and patch merging): a deviation from the
# Swin paper. At the demo's width 32, 0.02 is about a ninth of a fan-in scale, so with a zero classifier every
# residual branch starts nearly off and the micro Swin trains slowly (results/README, swin).
init_swin = init_dense


def init_swin_paper(module: nn.Module) -> None:
    """The ViT paper's init on one Swin module (for `apply`): fan-in-scaled kernels where Swin has trunc_normal(0.02)."""
    if isinstance(module, (Attention, Mlp)):
        module.init_paper()
    elif isinstance(module, PatchMerging):
        lecun_normal_(module.reduction.weight)
    elif isinstance(module, PatchStem):
        module.init_weights("paper")


# Swin's own options (`--model.window_size`, `--model.shift`), at the values that mean "not used" for other families
SWIN_OPTIONS = {
    "window_size": Option(7, int, "swin: side M of the attention windows (a window larger than a stage's map shrinks "
                                  "to it).", named_since=EARLIER),
    "shift": Option(True, bool, "swin: shift every second block's windows by M // 2 (false: the Swin paper's "
                                "\"w/o shifting\").", named_since=EARLIER),
}


def check_swin(cfg: ModelConfig) -> None:
    """Swin's own checks: its options, its init, the stage-1 width against its heads (its pooling: not read)."""
    if not isinstance(cfg.shift, bool):
        raise ValueError(f"model.shift must be true or false, got {cfg.shift!r}")
    check_choice("model.init", cfg.init, INITS)
    width, _, heads = SWIN_VARIANTS[cfg.variant]
    cfg.width = width if cfg.width is None else cfg.width  # 0 is refused below, not the variant's
    cfg.check_positive("img_size", "in_chans", "num_classes", "patch_size", "width", "window_size")
    if cfg.width % heads[0]:
        raise ValueError(f"model.width={cfg.width} must be a multiple of {heads[0]} (stage 1 heads of Swin-{cfg.variant})")


def window_partition(x: torch.Tensor, m: int) -> torch.Tensor:
    """(B, H, W, C) with H, W multiples of m -> (B * windows, m * m, C), windows in raster order."""
    b, h, w, c = x.shape
    x = x.view(b, h // m, m, w // m, m, c).transpose(2, 3)  # (B, H/m, W/m, m, m, C)
    return x.reshape(-1, m * m, c)


def window_merge(windows: torch.Tensor, m: int, h: int, w: int) -> torch.Tensor:
    """Inverse of window_partition: (B * windows, m * m, C) -> (B, H, W, C)."""
    c = windows.shape[-1]
    x = windows.view(-1, h // m, w // m, m, m, c).transpose(2, 3)  # (B, H/m, m, W/m, m, C)
    return x.reshape(-1, h, w, c)


def shift_mask(h: int, w: int, m: int, s: int) -> torch.Tensor:
    """(windows, m*m, m*m) additive mask for a map rolled by -s: -inf between tokens of different origin regions.

    After the roll, the last m - s rows (columns) of the bottom (right) windows hold two regions that were
    not neighbours in the image: rows < H - m, [H - m, H - s), >= H - s are labelled apart.
    """
    def labels(n: int) -> torch.Tensor:
        idx = torch.arange(n)
        return (idx >= n - m).long() + (idx >= n - s).long()  # 0, 1, 2 by region

    region = labels(h)[:, None] * 3 + labels(w)[None, :]  # (H, W)
    region = window_partition(region[None, :, :, None].float(), m)[..., 0]  # (windows, m*m)
    differ = region[:, :, None] != region[:, None, :]
    return torch.zeros(differ.shape).masked_fill(differ, float("-inf"))


class WindowBias(nn.Module):
    """What window attention adds to its logits: the relative bias table (if any) and the shift mask (if any)."""

    def __init__(self, heads: int, window: int, relative: bool):
        super().__init__()
        self.relative = RelativeBias2d(0, heads, (window, window), 0) if relative else None
        self.register_buffer("mask", None, persistent=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor | None:
        """(B * windows, h, N, hd) queries -> (B * windows | 1, h | 1, N, N) logits bias, or None."""
        bias = self.relative(q) if self.relative is not None else None  # (1, h, N, N)
        if self.mask is None:
            return bias
        windows, n = self.mask.shape[0], self.mask.shape[-1]
        mask = self.mask[:, None].to(q.dtype)  # (windows, 1, N, N)
        bias = mask if bias is None else mask + bias  # (windows, h|1, N, N)
        return bias[None].expand(q.shape[0] // windows, -1, -1, -1, -1).reshape(q.shape[0], -1, n, n)


class SwinBlock(nn.Module):
    """Pre-norm window attention then MLP; every second block of a stage shifts its windows."""

    def __init__(self, dim: int, heads: int, grid, window: int, shifted: bool, relative: bool, cfg: ModelConfig,
                 drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)  # Swin's LayerNorms keep PyTorch's eps (1e-5)
        self.attn = Attention(dim, heads, cfg.attn_dropout, cfg.dropout, cfg.qk_norm)
        self.ls1 = layer_scale(dim, cfg.layer_scale)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim, cfg.dropout)
        self.ls2 = layer_scale(dim, cfg.layer_scale)
        self.drop_path = DropPath(drop_path)
        self.window, self.shifted = window, shifted
        self.bias = WindowBias(heads, window, relative)
        self.set_grid(grid, window)

    def set_grid(self, grid: tuple[int, int], window: int) -> None:
        """Window and shift for this map: a window larger than the map shrinks to it, and then nothing shifts."""
        self.grid = tuple(grid)
        self.m = min(window, *grid)
        self.s = self.m // 2 if self.shifted and min(grid) > window else 0
        if self.bias.relative is not None and self.bias.relative.grid != (self.m, self.m):
            self.bias.relative.resample((self.m, self.m))  # bicubic, as Swin fine-tunes at a new window size
        padded = [-(-g // self.m) * self.m for g in grid]
        self.bias.mask = shift_mask(*padded, self.m, self.s) if self.s else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> (B, H, W, C)."""
        _, h, w, _ = x.shape
        y = self.norm1(x)
        if self.s:
            y = torch.roll(y, shifts=(-self.s, -self.s), dims=(1, 2))
        ph, pw = -h % self.m, -w % self.m
        y = F.pad(y, (0, 0, 0, pw, 0, ph))  # zero tokens fill the last windows, as the reference implementation
        y = self.attn(window_partition(y, self.m), self.bias)  # (B * windows, m*m, C)
        y = window_merge(y, self.m, h + ph, w + pw)[:, :h, :w]
        if self.s:
            y = torch.roll(y, shifts=(self.s, self.s), dims=(1, 2))
        x = x + self.drop_path(self.ls1(y))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class PatchMerging(nn.Module):
    """2x2 neighbouring tokens concatenated (4C), LayerNorm, linear to 2C: half the map, twice the width."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), 2C); an odd side is padded with a zero row/column."""
        b, h, w, c = x.shape
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        h, w = x.shape[1] // 2, x.shape[2] // 2
        # concat order (dx, dy, C): the channel layout timm's Swin weights use
        x = x.view(b, h, 2, w, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h, w, 4 * c)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """An optional patch merging, then `depth` blocks alternating regular and shifted windows."""

    def __init__(self, dim: int, depth: int, heads: int, grid, merge: bool, cfg: ModelConfig, rates: list[float],
                 relative: bool):
        super().__init__()
        self.merge = PatchMerging(dim // 2) if merge else None
        self.blocks = nn.ModuleList(
            SwinBlock(dim, heads, grid, cfg.window_size, cfg.shift and i % 2 == 1, relative, cfg, rates[i])
            for i in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merge is not None:
            x = self.merge(x)
        for block in self.blocks:
            x = block(x)
        return x


def stage_grids(grid: tuple[int, int], stages: int) -> list[tuple[int, int]]:
    """The token map of every stage: each merging halves it, rounding up."""
    grids = [tuple(grid)]
    for _ in range(stages - 1):
        grids.append(tuple(-(-g // 2) for g in grids[-1]))
    return grids


class Swin(BackboneParts, BlockAttention, nn.Module):
    """A Swin Transformer assembled from named parts; options as ModelConfig with arch='swin'.

    Args:
        variant: size preset (SWIN_VARIANTS: micro is the CPU demo size; T, S, B, L the paper's).
    """

    def __init__(self, variant: str = "T", **options):
        super().__init__()
        options = {**options, "arch": "swin"}
        self.config = cfg = ModelConfig(variant=variant, **options)
        _, depths, heads = SWIN_VARIANTS[cfg.variant]
        absolute, relative = SWIN_ENCODINGS[cfg.pos_encoding]
        self.stem = PatchStem(cfg)
        self.stem_norm = nn.LayerNorm(cfg.width)
        grid = self.stem.grid_for(cfg.img_hw)
        self.pos = Learned1d(cfg.width, heads[0], grid, 0) if absolute else None
        self.pos_drop = nn.Dropout(cfg.dropout)
        rates = drop_path_rates(cfg.drop_path, sum(depths))
        grids, dims = stage_grids(grid, len(depths)), [cfg.width * 2**i for i in range(len(depths))]
        self.stages = nn.ModuleList(
            SwinStage(dims[i], depths[i], heads[i], grids[i], i > 0, cfg, rates[sum(depths[:i]):], relative)
            for i in range(len(depths))
        )
        self.pool = POOLINGS[cfg.pooling](dims[-1], heads[-1])
        self.pool.norm.eps = 1e-5  # the paper's final LayerNorm, with Swin's eps
        self.apply(init_swin if cfg.init == "timm" else init_swin_paper)
        self.head = HEADS[cfg.head](dims[-1], cfg.num_classes, cfg.init)  # a zero classifier, as the ViT's
        self.width = dims[-1]

    @property
    def blocks(self) -> list[SwinBlock]:
        return [block for stage in self.stages for block in stage.blocks]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, D) pooled representation (D = 2^(stages-1) C)."""
        b = x.shape[0]
        x = self.stem_norm(self.stem(x))  # (B, N, C)
        if self.pos is not None:
            x = x + self.pos.embedding().to(x.dtype)
        x = self.pos_drop(x).reshape(b, *self.stem.grid_for(self._hw), -1)  # (B, H', W', C)
        for stage in self.stages:
            x = stage(x)
        return self.pool(x.flatten(1, 2))  # final LayerNorm on every token, then the mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(f"expected images (B, {self.config.in_chans}, H, W), got shape {tuple(x.shape)}")
        if tuple(x.shape[-2:]) != self._hw:
            raise ValueError(f"input {tuple(x.shape[-2:])} but the model was built for {self._hw}; "
                             f"call model.resize({tuple(x.shape[-2:])}) first")
        return self.head(self.forward_features(x))  # (B, num_classes)

    @property
    def _hw(self) -> tuple[int, int]:
        return self.config.img_hw

    @torch.no_grad()
    def resize(self, img_size: int | tuple[int, int], *, mode: str = "bicubic", window_size: int | None = None) -> None:
        """Adapt to a new input resolution (and window size): absolute table and bias tables resampled bicubically.

        `mode` is the ViT's choice for learned tables; Swin's tables follow its paper's bicubic only. The family
        does not declare RESIZE: a transfer to another grid would change its windows and merged stages.
        """
        if mode != "bicubic":
            raise ValueError(f"a Swin resamples its tables bicubically, not with mode={mode!r}")
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        grid = self.stem.grid_for(hw)
        if self.pos is not None:
            self.pos.resample(grid)
        window = window_size or self.config.window_size
        for stage, stage_grid in zip(self.stages, stage_grids(grid, len(self.stages))):
            for block in stage.blocks:
                block.set_grid(stage_grid, window)
        self.config.img_size, self.config.window_size = img_size, window

    def no_weight_decay(self) -> set[str]:
        """Position tables (absolute and relative) are not decayed."""
        return {n for n, _ in self.named_parameters() if n.startswith("pos.") or ".bias.relative." in n}


def swin_summary(config: ModelConfig) -> str:
    """A Swin run in its figures' titles: its size, encoding and whether its windows shift."""
    return f"Swin-{config.variant}, {config.pos_encoding}, shift={config.shift}"


SWIN = register(Family(
    name="swin", cls=Swin, variants=SWIN_VARIANTS, encodings=tuple(SWIN_ENCODINGS),
    defaults={"pooling": "gap", "pos_encoding": "relative_bias_2d", "patch_size": 4, "init": "timm"},
    options=SWIN_OPTIONS,
    # pooling is not read: always the paper's final LayerNorm and average (gap, its default)
    reads=frozenset({"patch_size", "width", "pos_encoding", "head", "dropout", "attn_dropout", "drop_path", "init",
                     "layer_scale", "qk_norm"}),
    offers=frozenset({ATTENTION_MAPS, TOKEN_GRID, PRE_LOGITS}),
    architecture=("window_size", "shift"),
    # a 14x14 map of 28x28 demo digits, two windows of 7 a side, then 7x7 after its one patch merging
    demo_patch=2,
    check=check_swin, viz="vit_lightning.commands.viz.windowed", summary=swin_summary,
    figure_notes={
        "rollout": "arch=swin: attention stays inside each window and tokens merge between stages, so there is no "
                   "token-to-token rollout through the network",
        "pos_similarity": "no absolute position table (Swin's default is the relative bias alone), so there is no "
                          "similarity to draw"},
    timm_loader=load_timm_swin,
    timm_reference=partial(timm_swin_reference, variants=SWIN_VARIANTS),
    name_neutral={"window_size": 7, "shift": True},  # left out of trial names: ViT runs were named before them
    name_parts=(NamePart("model.shift", None, {False: "noshift"}),),  # the Swin paper's "w/o shifting"
))
