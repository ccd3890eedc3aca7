"""One constructor for every backbone family, chosen by `arch` (the CLI's `--model.arch`), and timm's weights into
the family that imports them."""

from __future__ import annotations

from torch import nn

from vit_lightning.model.config import ModelConfig
from vit_lightning.model.family import FAMILIES, family_of


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


def load_timm_weights(model, timm_model: nn.Module) -> None:
    """Copy a timm model's weights into `model` (a ViT, or a Swin from a timm SwinTransformer) in place, by
    the importer of the model's family; afterwards both give the same logits.

    The ViT must be built with the same sizes, stem, pooling (see from_timm.vit.timm_pooling) and head,
    `pos_injection='stem'` and `pos_encoding='learned_1d'` (or `none` for a timm model without a
    position table). A ValueError says why a timm model cannot be loaded, before anything is copied.
    """
    if isinstance(timm_model, dict):
        raise TypeError("pass the timm model itself, not its state_dict: its pooling and layers decide whether the "
                        "logits can match")
    family = family_of(model)
    if family.timm_loader is None:
        raise ValueError(f"arch={family.name} has no timm importer")
    family.timm_loader(model, timm_model)
