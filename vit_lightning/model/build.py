"""One constructor for either backbone, chosen by `arch` (the CLI's `--model.arch`)."""

from __future__ import annotations

from torch import nn

from vit_lightning.model.config import ViTConfig
from vit_lightning.model.swin import Swin
from vit_lightning.model.vit import ViT

BACKBONES: dict[str, type[nn.Module]] = {"vit": ViT, "swin": Swin}


def build_backbone(**options) -> nn.Module:
    """ViT or Swin from ViTConfig's plain options; every option is checked before anything is built."""
    cfg = ViTConfig(**options)
    return BACKBONES[cfg.arch](**{k: v for k, v in options.items() if k != "arch"})
