"""Decoding an image folder's training JPEGs on the training device (data.decode_on): the loader workers only read
file bytes, and after the transfer a whole batch is decoded at once (torchvision's batched decode_jpeg, nvJPEG on a
GPU), then given the CPU path's training transform with the CPU path's random draws, and normalised. Owns the choice
of where decoding runs, the byte-reading worker's dataset view and collate, and the nvJPEG probe."""

from __future__ import annotations

import copy
import functools
import io
from collections.abc import Callable

import torch
from PIL import Image
from torchvision.transforms import v2

from vit_lightning.compat.torchvision import decode_jpegs, encode_jpeg
from vit_lightning.data.augment import BatchRandAugment

DECODE_ON = ("auto", "cpu", "device")  # where an image folder's training JPEGs are decoded (auto: device on a GPU)
JPEG_MAGIC = b"\xff\xd8\xff"  # every JPEG file starts with its SOI marker and a segment's marker
# the CPU path's per-image steps the device applies to each decoded image as they are (RandAugment goes batched)
PER_IMAGE = (v2.RandomResizedCrop, v2.Resize, v2.CenterCrop, v2.RandomHorizontalFlip)


def decode_place(choice: str, device: torch.device | None, in_memory: bool) -> str:
    """Where training images are decoded, 'cpu' or 'device': auto is device when training on a GPU whose nvJPEG
    works; data held in memory is never decoded in training (cpu)."""
    if in_memory:
        return "cpu"
    if choice == "auto":
        return "device" if device is not None and nvjpeg_works(device) else "cpu"
    return choice


def nvjpeg_works(device: torch.device) -> bool:
    """True when torchvision decodes JPEGs on this CUDA device (one tiny decode, its answer kept per device)."""
    return torch.device(device).type == "cuda" and _decodes_on(str(torch.device(device)))


@functools.cache
def _decodes_on(device: str) -> bool:
    try:
        decode_jpegs([encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))], torch.device(device))
    except (RuntimeError, ValueError, NotImplementedError):  # no nvJPEG in this build, or no usable device
        return False
    return True


class Encoded:
    """A batch's images as the workers read them: JPEG bytes (uint8 (n,)) or, for other formats, the image decoded by
    PIL (uint8 (3, H, W)). Its `to` only notes the device: nvJPEG reads the bytes from the CPU."""

    def __init__(self, images: list[torch.Tensor], device: torch.device | str = "cpu"):
        self.images, self.device = images, torch.device(device)

    def __len__(self) -> int:
        return len(self.images)

    def to(self, device, non_blocking: bool = False) -> Encoded:
        """Lightning's transfer calls this for the batch: the same images, to be decoded on `device`."""
        return Encoded(self.images, device)


def read_encoded(path: str) -> torch.Tensor:
    """A JPEG file's bytes as uint8 (n,); any other image decoded here by PIL, as RGB uint8 (3, H, W)."""
    with open(path, "rb") as file:
        data = file.read()
    if data.startswith(JPEG_MAGIC):
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with Image.open(io.BytesIO(data)) as img:
        return v2.functional.pil_to_tensor(img.convert("RGB"))  # as torchvision's ImageFolder loader converts


def byte_view(folder):
    """A torchvision ImageFolder whose workers read each file's bytes only: no decode, no transform."""
    view = copy.copy(folder)
    view.loader, view.transform = read_encoded, None
    return view


def decode(images: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 (3, H, W) RGB images on `device`: the JPEG bytes among `images` decoded there in one batched call."""
    jpegs = [img for img in images if img.dim() == 1]
    decoded = iter(decode_jpegs(jpegs, device) if jpegs else [])
    return [next(decoded) if img.dim() == 1 else img.to(device, non_blocking=True) for img in images]


class DecodeCollate:
    """The byte-reading workers' collate, (Encoded, int64 (B,) labels), and its second half after the transfer:
    `finish` decodes the batch on its device and applies the CPU path's training transform `train_tf` there.

    Each image goes through train_tf's own crop and flip (so the same draws from the global RNG, in the same order,
    as the CPU path's per-image transform); its RandAugment's ops are drawn per image in v2's order, then applied to
    the whole batch by BatchRandAugment, the code that augments in-memory batches on the device.
    """

    defer = True  # the data module calls finish after the transfer

    def __init__(self, train_tf: v2.Compose, normalise: Callable[[torch.Tensor], torch.Tensor]):
        steps = [t for t in train_tf.transforms if not isinstance(t, v2.PILToTensor)]
        ra = steps.pop() if steps and isinstance(steps[-1], v2.RandAugment) else None
        odd = [type(t).__name__ for t in steps if not isinstance(t, PER_IMAGE)]
        if odd:
            raise TypeError(f"decoding on the device cannot apply {', '.join(odd)} (RandAugment must come last)")
        self.steps = v2.Compose(steps)
        self.augment = BatchRandAugment(ra.num_ops, ra.magnitude, ra.num_magnitude_bins) if ra is not None else None
        self.normalise = normalise

    def __call__(self, samples: list) -> tuple[Encoded, torch.Tensor]:
        return Encoded([s[0] for s in samples]), torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)

    def finish(self, batch: Encoded) -> torch.Tensor:
        """The normalised float (B, 3, S, S) training batch on batch.device."""
        out, draws = [], []
        for img in decode(batch.images, batch.device):
            out.append(self.steps(img))  # (3, S, S) uint8; crop and flip draw here, as the CPU path per image
            if self.augment is not None:
                draws.append(self.augment.draw_one())
        x = torch.stack(out)  # (B, 3, S, S) uint8
        if self.augment is not None:
            ops, negative = (torch.tensor(list(d)).T for d in zip(*draws))  # (num_ops, B) each
            x = self.augment.apply(x, ops, negative)
        return self.normalise(x)
