"""The Vision Transformer: stem -> position encoding -> encoder blocks -> pooling -> head."""

from __future__ import annotations

import torch
from torch import nn

from vit_lightning.model.config import ViTConfig
from vit_lightning.model.layers import Block, drop_path_rates, keeping_attention
from vit_lightning.model.pooling import HEADS, POOLINGS, Registers
from vit_lightning.model.position import PositionEncoding
from vit_lightning.model.stems import STEMS


class ViT(nn.Module):
    """A ViT assembled from named parts; see ViTConfig for the options.

    Args:
        variant: size preset (VARIANTS: micro is the CPU demo size, Ti, S, B, L, H the paper's and DeiT's).
    """

    def __init__(self, variant: str = "micro", **options):
        super().__init__()
        self.config = cfg = ViTConfig(variant=variant, **options)
        if cfg.arch != "vit":
            raise ValueError(f"ViT builds arch='vit', got arch={cfg.arch!r}; use Swin (or build_backbone)")
        self.stem = STEMS[cfg.stem](cfg)
        self.pool = POOLINGS[cfg.pooling](cfg.width, cfg.heads)
        self.registers = Registers(cfg.width, cfg.reg_tokens)
        grid = self.stem.grid_for(cfg.img_hw)
        positioned = self.pool.num_prefix if cfg.pos_embed_class else 0  # the [class] token's row in the table
        self.pos = PositionEncoding(
            cfg.pos_encoding, cfg.pos_injection, cfg.width, cfg.heads, grid, cfg.depth, self.num_prefix, positioned
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
            x = block(x if i == 0 else self.pos.add(x, i), self.pos.attention_bias(i))
        return self.pool(self.registers.drop(x, self.pool.num_prefix))

    @property
    def num_prefix(self) -> int:
        """Tokens before the patches: the pooling's [class] token (if any), then the registers."""
        return self.pool.num_prefix + self.registers.count

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, D) the representation a linear probe reads: the head's hidden layer if it has one."""
        feats = self.forward_features(x)
        return self.head[:-1](feats) if isinstance(self.head, nn.Sequential) else feats  # big_vision's pre_logits

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
    def resize(self, img_size: int | tuple[int, int], mode: str = "bicubic", patch_size: int | None = None) -> None:
        """Adapt to a new input resolution (and patch size: the kernel PI-resized) by resampling position encodings."""
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if patch_size is not None and patch_size != self.config.patch_size:
            if not hasattr(self.stem, "resize_patch"):
                raise ValueError(f"the {self.config.stem} stem has no patch kernel to resize to patch_size={patch_size}")
            self.stem.resize_patch(patch_size)
            self.config.patch_size = patch_size
        self.pos.resample(self.stem.grid_for(hw), mode)
        self.config.img_size = img_size

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every block, each (B, heads, T, T)."""
        with keeping_attention(self.blocks):
            self(x)
            return [block.attn.probs for block in self.blocks]

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that should not be decayed: position tables, the [class] token, registers, the probe."""
        return {n for n, _ in self.named_parameters()
                if n.startswith("pos.") or n in ("pool.token", "pool.probe", "registers.tokens")}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

