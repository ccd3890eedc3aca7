"""The shared ViT backbone and its parts."""

from vit_lightning.model.config import VARIANTS, ViTConfig
from vit_lightning.model.pooling import HEADS, POOLINGS
from vit_lightning.model.position import ENCODINGS, INJECTIONS
from vit_lightning.model.stems import STEMS
from vit_lightning.model.timm_weights import load_timm_weights
from vit_lightning.model.vit import ViT

__all__ = [
    "ENCODINGS", "HEADS", "INJECTIONS", "POOLINGS", "STEMS", "VARIANTS", "ViT", "ViTConfig", "load_timm_weights",
]
