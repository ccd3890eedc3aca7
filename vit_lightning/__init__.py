"""vit-lightning: re-run the ablations of "An Image is Worth 16x16 Words" on your own data."""

from vit_lightning.model import Swin, ViT, load_timm_weights

__version__ = "0.1.0"
__all__ = ["Swin", "ViT", "load_timm_weights", "__version__"]
