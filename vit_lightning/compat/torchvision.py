"""torchvision's RandAugment internals that BatchRandAugment shares, and its JPEG codec without its deprecation
warning (torchvision < 0.30, pyproject.toml)."""

from __future__ import annotations

import warnings

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


def decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes (CPU uint8 (n,) each) decoded on `device` as RGB uint8 (3, H, W): one batched nvJPEG call on a GPU.

    torchvision 0.29 deprecates its image decoders for TorchCodec and warns at every call; this is the one caller.
    On a GPU the caller's stream is drained first: torchvision's CUDA decoder allocates its outputs on the caller's
    stream but writes them from a stream of its own that does not wait for it, so it can overwrite memory that
    kernels still queued (the previous training step's) are reading (pytorch/vision PR 9606).
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def encode_jpeg(image: torch.Tensor, quality: int = 90) -> torch.Tensor:
    """A uint8 (3, H, W) CPU image as JPEG bytes (uint8 (n,)), without torchvision 0.29's deprecation warning."""
    from torchvision.io import encode_jpeg as encode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return encode(image, quality=quality)
