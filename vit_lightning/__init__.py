"""vit-lightning: re-run the ablations of "An Image is Worth 16x16 Words" on your own data."""

from vit_lightning.model import FAMILIES, load_timm_weights

__version__ = "0.1.0"
# every backbone family's class by its own name (ViT, ...), as `from vit_lightning import ViT`
globals().update({family.cls.__name__: family.cls for family in FAMILIES.values()})
__all__ = [*(family.cls.__name__ for family in FAMILIES.values()), "load_timm_weights", "__version__"]
