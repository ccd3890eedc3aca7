"""vit-lightning: re-run the ablations of "An Image is Worth 16x16 Words" on your own data."""

from vit_lightning.model import FAMILIES, load_timm_weights

__version__ = "0.1.0"
__all__ = ["load_timm_weights", "__version__"]


def __getattr__(name: str):
    """Every backbone family's class by its own name (ViT, ...), as `from vit_lightning import ViT`.

    Looked up when asked, not at import: reading the registry loads the families of entry points, and a bad one
    is then the error of the command that reads it (one line), not a traceback of every import.
    """
    classes = {family.cls.__name__: family.cls for family in FAMILIES.values()} if name[:1].isupper() else {}
    if name not in classes:
        raise AttributeError(f"module 'vit_lightning' has no attribute {name!r}")
    return classes[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *(family.cls.__name__ for family in FAMILIES.values())})
