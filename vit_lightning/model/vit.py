"""The Vision Transformer: stem -> position encoding -> encoder blocks -> pooling -> head."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from vit_lightning.core.checks import check_choice, number_in, span
from vit_lightning.model import bias2d  # noqa: F401  (adds its encodings to ENCODINGS before the family registers)
from vit_lightning.model.config import ModelConfig
from vit_lightning.model.family import CAPABILITIES, BackboneParts, BlockAttention, Family, Option, register
from vit_lightning.model.from_timm.vit import load_timm_vit, timm_vit_options
from vit_lightning.model.layers import INITS, Block, drop_path_rates
from vit_lightning.model.naming import EARLIER, NAMING, NamePart
from vit_lightning.model.pooling import HEADS, POOLINGS, Registers
from vit_lightning.model.position import (
    ENCODING_OPTIONS,
    ENCODINGS,
    INJECTIONS,
    PEG_PADDINGS,
    RELATIVE_SCALES,
    PositionEncoding,
)
from vit_lightning.model.rope import COORDS, check_head_dim
from vit_lightning.model.stems import STEMS

# name: (layers, width, MLP size, heads), the paper's Table 1 plus Ti/S (DeiT) and a CPU demo size
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "micro": (4, 64, 256, 4),
    "Ti": (12, 192, 768, 3),
    "S": (12, 384, 1536, 6),
    "B": (12, 768, 3072, 12),
    "L": (24, 1024, 4096, 16),
    "H": (32, 1280, 5120, 16),
}

# The ViT's options that code outside model/ asks about by their role, named here only: where an encoding enters
# (INJECTIONS; each encoding allows some) and the stem (STEMS; only `patch` cuts pixel patches)
INJECTION_OPTION = "pos_injection"
STEM_OPTION = "stem"
PIXEL_STEM = "patch"


def pixel_patches(options) -> bool:
    """Options (a dict, or a ModelConfig) of a model whose stem cuts pixel patches, a kernel that resizes with the
    patch size: any family without a stem option, the ViT with the patch stem (not the hybrid's ResNet features)."""
    get = options.get if isinstance(options, dict) else lambda name, default: getattr(options, name, default)
    return get(STEM_OPTION, PIXEL_STEM) == PIXEL_STEM


MAX_REG_TOKENS = 1024  # registers: 4 to 16 in their paper; far more only fills memory (attention is quadratic in them)

# The ViT's own options (`--model.<name>`), at the value that means "not used"; ModelConfig checks their choices.
VIT_OPTIONS = {
    "depth": Option(None, int | None, "vit: number of encoder blocks, overriding the variant's.", named_since=EARLIER),
    "heads": Option(None, int | None, "vit: attention heads, overriding the variant's; must divide width.", named_since=EARLIER),
    "mlp_dim": Option(None, int | None, "vit: hidden size of the blocks' MLP, overriding the variant's.", named_since=EARLIER),
    "pos_injection": Option("stem", str, "vit: where the encoding enters, as the encoding allows.", INJECTIONS,
                            named_since=EARLIER),
    "stem": Option("patch", str, "vit: patch, or hybrid (a BiT ResNet of stages `hybrid_layers`, root width "
                                 "`hybrid_width`).", tuple(STEMS), named_since=EARLIER),
    "hybrid_layers": Option((3, 4, 9), tuple[int, ...], "vit: bottleneck blocks per ResNet stage of the hybrid stem.",
                            named_since=EARLIER),
    "hybrid_width": Option(64, int, "vit: root width of the hybrid stem's ResNet (a multiple of 32).",
                           named_since=EARLIER),
    "reg_tokens": Option(0, int, "vit: register tokens (Darcet et al. 2024): learned tokens after the [class] token, "
                                 "without a position, left out of the pooling, the few-shot features and the figures."),
    "pos_embed_class": Option(True, bool, "vit: true: the learned_1d table has a row for the [class] token (the "
                                          "paper); false: only the patches have one (DeiT-III, timm's no_embed_class)."),
    # the encodings' own options (each encoding's `reads` says which it takes)
    "relative_scale": Option(ENCODING_OPTIONS["relative_scale"], str, "vit, relative_1d only: its q.r logits divided "
                             "by sqrt(head_dim) (sqrt_d, as the content logits) or unscaled (none); the paper leaves it "
                             "open.", RELATIVE_SCALES),
    "rope_theta": Option(ENCODING_OPTIONS["rope_theta"], float | None, "vit, RoPE encodings only: the base frequency "
                         "theta (pair k of the hd/4 per axis turns at theta^(-k/(hd/4)) radians per coordinate unit); "
                         "None: NAVER's, 100 for rope_axial, 10 for rope_mixed (its start)."),
    "rope_coords": Option(ENCODING_OPTIONS["rope_coords"], str, "vit, RoPE encodings only: the (x, y) a patch gets, "
                          "which decides what a larger grid means: patch (column and row index: a larger grid "
                          "extrapolates to new positions; NAVER's RoPE-ViT and timm's naver_in1k models), ref_grid "
                          "(indices rescaled to span the grid the model was built for: a larger grid interpolates; "
                          "EVA-02, timm's ref_feat_shape), normalized (patch centres in [-1, 1] on either axis, turned "
                          "by 2 pi per unit: interpolates; DINOv3).", COORDS),
    "peg_padding": Option(ENCODING_OPTIONS["peg_padding"], str, "vit, peg only: PEG's border: zeros (CPVT's; the "
                          "zero border is what tells a patch where it is) or circular (the grid wraps around: "
                          "neighbourhood mixing without absolute position, a control).", PEG_PADDINGS),
}


def check_vit(cfg: ModelConfig) -> None:
    """The ViT's own checks: its parts by name, the encoding's injections, the variant's sizes, the hybrid stem."""
    check_choice("model.pooling", cfg.pooling, POOLINGS)
    check_choice("model.init", cfg.init, INITS)
    cfg.hybrid_layers = tuple(cfg.hybrid_layers)
    if not number_in(cfg.reg_tokens, 0, MAX_REG_TOKENS, integer=True):  # before any memory is allocated
        raise ValueError(f"model.reg_tokens must be a count >= 0 and at most {MAX_REG_TOKENS} (every token adds a row "
                         f"and a column to every attention map), got {cfg.reg_tokens!r}")
    for option, default in ENCODING_OPTIONS.items():  # an encoding's own option, set for another encoding
        if getattr(cfg, option) != default and option not in ENCODINGS[cfg.pos_encoding].reads:
            readers = [name for name, kind in ENCODINGS.items() if option in kind.reads]
            raise ValueError(f"model.{option}={getattr(cfg, option)!r} applies to pos_encoding={' or '.join(readers)} "
                             f"only, not pos_encoding={cfg.pos_encoding}")
    allowed = ENCODINGS[cfg.pos_encoding].injections
    if cfg.pos_injection not in allowed:
        raise ValueError(
            f"model.pos_injection={cfg.pos_injection!r} is not allowed with pos_encoding={cfg.pos_encoding!r}; "
            f"allowed: {', '.join(allowed)}"
        )
    depth, width, mlp_dim, heads = VARIANTS[cfg.variant]
    # None: the variant's; 0 is a size, refused by check_positive (not read as "the variant's")
    cfg.depth, cfg.width = _given(cfg.depth, depth), _given(cfg.width, width)
    cfg.mlp_dim, cfg.heads = _given(cfg.mlp_dim, mlp_dim), _given(cfg.heads, heads)
    cfg.check_positive("img_size", "in_chans", "num_classes", "patch_size", "width", "depth", "heads", "mlp_dim")
    if cfg.depth < ENCODINGS[cfg.pos_encoding].min_depth:  # PEG acts between blocks: after block 0
        raise ValueError(f"model.pos_encoding={cfg.pos_encoding!r} acts between blocks, so it needs depth >= "
                         f"{ENCODINGS[cfg.pos_encoding].min_depth}; got depth={cfg.depth}")
    if cfg.width % cfg.heads:
        divisors = [h for h in range(1, cfg.width + 1) if cfg.width % h == 0]
        raise ValueError(f"model.heads={cfg.heads} does not divide width={cfg.width}; valid heads: {divisors}")
    if not cfg.pos_embed_class:
        if not POOLINGS[cfg.pooling].num_prefix:
            raise ValueError(f"model.pos_embed_class=false leaves the [class] token out of the position table, but "
                             f"pooling={cfg.pooling!r} has no [class] token")
        if not ENCODINGS[cfg.pos_encoding].prefix_rows:
            raise ValueError(f"model.pos_embed_class=false: pos_encoding={cfg.pos_encoding!r} gives the [class] token "
                             "no position anyway; only learned_1d has a [class] row to leave out")
    check_rope(cfg)
    if cfg.stem == "hybrid" and (not cfg.hybrid_layers or min(cfg.hybrid_layers) < 1 or cfg.hybrid_width % 32):
        raise ValueError(
            f"model.stem='hybrid' needs model.hybrid_layers of positive block counts and model.hybrid_width a "
            f"multiple of 32, got hybrid_layers={list(cfg.hybrid_layers)}, hybrid_width={cfg.hybrid_width}"
        )


def _given(value, variant):
    """An option's value, or the variant's where it is None."""
    return variant if value is None else value


MAX_ROPE_THETA = 1e9  # RoPE's base: 10 to 1e4 in use; an infinite one stops all but one frequency per axis


def check_rope(cfg: ModelConfig) -> None:
    """RoPE's options: with a rotary encoding only, a positive theta, a head width it can split."""
    if not ENCODINGS[cfg.pos_encoding].rotary:
        return  # its options set for another encoding: refused by check_vit
    if cfg.rope_theta is not None and not number_in(cfg.rope_theta, 0, MAX_ROPE_THETA, low_open=True):
        raise ValueError(f"model.rope_theta must be a positive base frequency, a finite number in "
                         f"{span(0, MAX_ROPE_THETA, low_open=True)} (or None: NAVER's default), got {cfg.rope_theta!r}")
    check_head_dim(cfg.width // cfg.heads)


class ViT(BackboneParts, BlockAttention, nn.Module):
    """A ViT assembled from named parts; see ModelConfig (shared options) and VIT_OPTIONS (its own) for the options.

    Args:
        variant: size preset (VARIANTS: micro is the CPU demo size, Ti, S, B, L, H the paper's and DeiT's).
    """

    def __init__(self, variant: str = "micro", **options):
        super().__init__()
        self.config = cfg = ModelConfig(variant=variant, **options)
        if cfg.arch != "vit":
            raise ValueError(f"ViT builds arch='vit', got arch={cfg.arch!r}; use build_backbone")
        self.stem = STEMS[cfg.stem](cfg)
        self.pool = POOLINGS[cfg.pooling](cfg.width, cfg.heads)
        self.registers = Registers(cfg.width, cfg.reg_tokens)
        grid = self.stem.grid_for(cfg.img_hw)
        positioned = self.pool.num_prefix if cfg.pos_embed_class else 0  # the [class] token's row in the table
        options = {name: getattr(cfg, name) for name in ENCODING_OPTIONS}  # the encoding takes those it reads
        self.pos = PositionEncoding(
            cfg.pos_encoding, cfg.pos_injection, cfg.width, cfg.heads, grid, cfg.depth, self.num_prefix, positioned, options
        )
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, cfg.mlp_dim, cfg.dropout, cfg.attn_dropout, rate, cfg.layer_scale, cfg.qk_norm)
            for rate in drop_path_rates(cfg.drop_path, cfg.depth)
        )
        for part in (self.stem, self.pool, *self.blocks):  # position encodings initialise themselves when built
            part.init_weights(cfg.init)
        self.head = HEADS[cfg.head](cfg.width, cfg.num_classes, cfg.init)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images -> (B, D) pooled representation."""
        x = self.pool.prepend(self.registers.prepend(self.stem(x)))  # (B, T, D), T = [class] + registers + N
        x = self.pos_drop(self.pos.add(x, 0))
        for i, block in enumerate(self.blocks):
            x = block(x if i == 0 else self.pos.add(x, i), self.pos.attention_bias(i), self.pos.rotation(i))
        return self.pool(self.registers.drop(x, self.pool.num_prefix))

    @property
    def num_prefix(self) -> int:
        """Tokens before the patches: the pooling's [class] token (if any), then the registers."""
        return self.pool.num_prefix + self.registers.count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self.head(self.forward_features(x))  # (B, num_classes)

    def _check_input(self, x: torch.Tensor) -> None:
        if x.ndim != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(f"expected images (B, {self.config.in_chans}, H, W), got shape {tuple(x.shape)}")
        grid = self.stem.grid_for(tuple(x.shape[-2:]))
        if grid != self.pos.grid:
            raise ValueError(
                f"input {tuple(x.shape[-2:])} gives a {grid} token grid but the model was built for {self.pos.grid}; "
                f"call model.resize({tuple(x.shape[-2:])}) first"
            )

    @torch.no_grad()
    def resize(self, img_size: int | tuple[int, int], *, mode: str = "bicubic", patch_size: int | None = None) -> None:
        """Adapt to a new input resolution (and patch size: the kernel PI-resized) by resampling position encodings."""
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if patch_size is not None and patch_size != self.config.patch_size:
            if not hasattr(self.stem, "resize_patch"):
                raise ValueError(f"the {self.config.stem} stem has no patch kernel to resize to patch_size={patch_size}")
            self.stem.resize_patch(patch_size)
            self.config.patch_size = patch_size
        self.pos.resample(self.stem.grid_for(hw), mode)
        self.config.img_size = img_size

    def position_facts(self) -> dict:
        """What the run record keeps about the position encoding as built (e.g. ALiBi's largest bias per head)."""
        return self.pos.facts()

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that should not be decayed: position tables, the [class] token, registers, the probe."""
        return {n for n, _ in self.named_parameters()
                if n.startswith("pos.") or n in ("pool.token", "pool.probe", "registers.tokens")}


# its parts of a trial's name: the hybrid stem's ResNet in the patch size's place (the ViT's 1x1 patches over its map);
# since rule 2 the options its committed profiles sweep, in words away from their defaults
VIT_NAME_PARTS = (
    NamePart("model.stem", None, {"hybrid": "hybrid{model.hybrid_layers}"}, replaces="model.patch_size"),
    *(NamePart(f"model.{key}", form, {VIT_OPTIONS[key].default: None}, since=NAMING)
      for key, form in (("reg_tokens", "reg{}"), ("relative_scale", "scale-{}"), ("peg_padding", "pad-{}"))),
)


def vit_summary(config: ModelConfig) -> str:
    """A ViT run in its figures' titles: the encoding and where it enters, the pooling, the registers if any."""
    registers = f", {config.reg_tokens} registers" if config.reg_tokens else ""
    return f"{config.pos_encoding} ({config.pos_injection}), {config.pooling}{registers}"


VIT = register(Family(
    name="vit", cls=ViT, variants=VARIANTS, encodings=tuple(ENCODINGS),
    defaults={"pooling": "cls", "pos_encoding": "learned_1d", "patch_size": 16, "init": "paper"},
    options=VIT_OPTIONS,
    reads=frozenset({"patch_size", "width", "pos_encoding", "pooling", "head", "dropout", "attn_dropout", "drop_path",
                     "init", "layer_scale", "qk_norm"}),  # every shared option
    architecture=("depth", "heads", "mlp_dim", "pos_injection", "stem", "hybrid_layers", "hybrid_width", "reg_tokens",
                  "pos_embed_class", *ENCODING_OPTIONS),
    demo_patch=7,  # 4x4 tokens of the 28x28 demo digits
    check=check_vit, viz="vit_lightning.commands.viz.run", summary=vit_summary,
    # the hybrid stem's 1x1 "patches" are ResNet features, not pixels
    figure_notes={"patch_pca": "stem=hybrid: the patch embedding is a 1x1 projection of ResNet features, so there are "
                               "no pixel filters to draw"},
    timm_loader=load_timm_vit,
    timm_options=partial(timm_vit_options, variants=VARIANTS),
    offers=frozenset(CAPABILITIES),  # attention maps, a token grid, pre-logits, resizing to a new grid
    name_parts=VIT_NAME_PARTS,
))
