"""torchvision's RandAugment internals that BatchRandAugment shares (torchvision < 0.30, pyproject.toml)."""

from __future__ import annotations

import torch
from torchvision.transforms import v2


def augmentation_space(ra: v2.RandAugment) -> list:
    """[(op name, (magnitudes_fn, signed))]: RandAugment's own op table, so batch draws use the same ops and bins.

    Private: torchvision exposes no op table; reusing its own keeps the ops and magnitudes exactly its.
    """
    return list(ra._AUGMENTATION_SPACE.items())


def apply_op(ra: v2.RandAugment, x: torch.Tensor, name: str, magnitude: float) -> torch.Tensor:
    """RandAugment's op `name` at `magnitude` on a uint8 batch, with its interpolation and fill.

    Private: the per-op dispatch of v2.RandAugment is `_apply_image_or_video_transform` and its fill `_fill`;
    the public call draws the op itself, once for the whole batch.
    """
    return ra._apply_image_or_video_transform(x, name, magnitude, interpolation=ra.interpolation, fill=ra._fill)
