"""A small convolutional backbone family for the tests: its own options and blocks, no attention, no positions.

It meets the family contract from its registry entry alone: patch stem -> depthwise-separable residual conv
blocks on the patch grid -> LayerNorm of the mean -> head. It offers a token grid and pre-logits, not attention
maps or resizing, so the figures and commands that need those say so. Run as a script, it is `vit-ablate` with
the family registered (a sweep's `${program}` for trials in their own processes).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from vit_lightning.model import FAMILIES, HEADS, ViTConfig
from vit_lightning.model.config import check_choice
from vit_lightning.model.family import PRE_LOGITS, TOKEN_GRID, BackboneParts, Family, Option, register
from vit_lightning.model.layers import INITS
from vit_lightning.model.stems import PatchStem

NAME = "conv"
CONV_VARIANTS = {"micro": (32, 2)}  # name: (width, blocks)
CONV_OPTIONS = {"kernel_size": Option(3, int, "conv: side of the depthwise kernels of its blocks (odd).")}


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
    """The conv family's backbone; options as ViTConfig with arch='conv' and its own kernel_size."""

    def __init__(self, variant: str = "micro", **options):
        super().__init__()
        self.config = cfg = ViTConfig(**{**options, "arch": NAME, "variant": variant})
        self.stem = PatchStem(cfg)
        self.stem.init_weights(cfg.init)
        self.blocks = nn.ModuleList(ConvBlock(cfg.width, cfg.kernel_size) for _ in range(CONV_VARIANTS[variant][1]))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = HEADS[cfg.head](cfg.width, cfg.num_classes, cfg.init)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self.stem.grid_for(tuple(x.shape[-2:]))
        x = self.stem(x).transpose(1, 2).reshape(x.shape[0], -1, h, w)  # (B, D, H', W')
        for block in self.blocks:
            x = block(x)
        return self.norm(x.mean(dim=(2, 3)))  # (B, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))

    def no_weight_decay(self) -> set[str]:
        return set()


def check_conv(cfg: ViTConfig) -> None:
    """The conv family's own checks: its kernel, its pooling and init, the variant's width."""
    if isinstance(cfg.kernel_size, bool) or not isinstance(cfg.kernel_size, int) or cfg.kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be an odd number of pixels, got {cfg.kernel_size!r}")
    check_choice(f"pooling (arch={NAME})", cfg.pooling, ("gap",))
    check_choice("init", cfg.init, INITS)
    cfg.width = cfg.width or CONV_VARIANTS[cfg.variant][0]
    cfg.check_positive("img_size", "in_chans", "num_classes", "patch_size", "width", "kernel_size")


CONV = Family(name=NAME, cls=ConvNet, variants=CONV_VARIANTS, encodings=("none",),
              defaults={"pooling": "gap", "pos_encoding": "none", "patch_size": 4, "init": "paper"},
              options=CONV_OPTIONS, architecture=("kernel_size",), demo_patch=4, check=check_conv,
              offers=frozenset({TOKEN_GRID, PRE_LOGITS}))


def add() -> Family:
    """Register the family (and drop the sweep's cached fit parser, which lists every family's options)."""
    from vit_lightning.commands.sweep import validate

    register(CONV)
    validate.fit_parser.cache_clear()
    return CONV


def remove() -> None:
    from vit_lightning.commands.sweep import validate

    FAMILIES.pop(NAME, None)
    validate.fit_parser.cache_clear()


if __name__ == "__main__":  # a trial's own process: the family registered, then the command
    from vit_lightning import cli

    add()
    sys.exit(cli.main(sys.argv[1:]))
