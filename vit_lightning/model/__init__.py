"""The shared ViT backbone and its parts."""

from vit_lightning.model.build import BACKBONES, build_backbone
from vit_lightning.model.config import ARCHS, SWIN_ENCODINGS, SWIN_VARIANTS, VARIANTS, ViTConfig
from vit_lightning.model.pooling import HEADS, POOLINGS
from vit_lightning.model.position import ENCODINGS, INJECTIONS
from vit_lightning.model.stems import STEMS
from vit_lightning.model.swin import Swin
from vit_lightning.model.timm_weights import load_timm_weights
from vit_lightning.model.vit import ViT

__all__ = [
    "ARCHS", "BACKBONES", "ENCODINGS", "HEADS", "INJECTIONS", "POOLINGS", "STEMS", "SWIN_ENCODINGS", "SWIN_VARIANTS",
    "VARIANTS", "Swin", "ViT", "ViTConfig", "build_backbone", "load_timm_weights",
]
