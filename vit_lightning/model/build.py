"""One constructor for every backbone family, chosen by `arch` (the CLI's `--model.arch`)."""

from __future__ import annotations

from torch import nn

from vit_lightning.model.config import ModelConfig
from vit_lightning.model.family import FAMILIES


def build_backbone(**options) -> nn.Module:
    """The family's backbone from ModelConfig's plain options; every option is checked before anything is built."""
    cfg = ModelConfig(**options)
    return FAMILIES[cfg.arch].cls(**{k: v for k, v in options.items() if k != "arch"})


def timm_twin(timm_model: nn.Module) -> tuple[dict, nn.Module]:
    """(options, our model holding its weights) for a timm model some family imports; ValueError if none does."""
    for family in FAMILIES.values():
        options = family.timm_options(timm_model) if family.timm_options else None
        if options is not None:
            ours = family.cls(**{k: v for k, v in options.items() if k != "arch"})
            family.timm_loader(ours, timm_model)
            return options, ours
    raise ValueError(f"no backbone family imports a timm {type(timm_model).__name__}")
