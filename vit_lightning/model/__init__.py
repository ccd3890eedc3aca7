"""The backbone families (ViT, Swin) and their parts; family.FAMILIES is the registry (ViTConfig: ModelConfig's
earlier name, an alias)."""

from vit_lightning.model.vit import INJECTION_OPTION, STEM_OPTION, VARIANTS, ViT, pixel_patches  # noqa: I001  (the first family registers first)
from vit_lightning.model.swin import Swin
from vit_lightning.model.build import build_backbone, load_timm_weights, timm_twin
from vit_lightning.model.config import ModelConfig, ViTConfig
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES, Backbone, Family, family_of
from vit_lightning.model.pooling import HEADS, POOLINGS
from vit_lightning.model.position import ENCODING_OPTIONS, ENCODINGS, INJECTIONS
from vit_lightning.model.stems import STEMS

__all__ = [
    "DEFAULT_ARCH", "ENCODING_OPTIONS", "ENCODINGS", "FAMILIES", "HEADS", "INJECTION_OPTION", "INJECTIONS", "POOLINGS",
    "STEM_OPTION", "STEMS", "VARIANTS", "Backbone", "Family", "ModelConfig", "Swin", "ViT", "ViTConfig", "build_backbone",
    "family_of", "load_timm_weights", "pixel_patches", "registered_names", "timm_twin",
]


def registered_names() -> dict[str, tuple[str, ...]]:
    """Each option whose values come from a registry -> the names registered now (every family's encodings)."""
    encodings = dict.fromkeys([*ENCODINGS, *(name for family in FAMILIES.values() for name in family.encodings)])
    return {"model.pos_encoding": tuple(encodings), "model.pooling": tuple(POOLINGS), "model.head": tuple(HEADS),
            "model.stem": tuple(STEMS)}
