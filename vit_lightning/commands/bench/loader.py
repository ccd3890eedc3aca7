"""The data path alone: images/s each profile's training loader delivers per CPU worker, and the workers a step needs;
for an image folder also the byte-reading worker of decoding on the device (data.decode_on=device) and that decode."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vit_lightning.ablation import BASE
from vit_lightning.commands.bench.timing import sync
from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.data.decode import decode_place

PROFILES = tuple(BASE)  # demo, cifar10, imagenet
JPEG_SIZE = (500, 375)  # about ImageNet's mean training image (W, H)


@dataclass
class ProfileFacts:
    """What the bench needs from a profile: its loader options, its model and its training precision."""

    name: str
    data: dict  # ImageDataModule keyword arguments
    variant: str
    patch_size: int
    img_size: int
    in_chans: int
    num_classes: int
    batch_size: int
    num_workers: int
    precision: str  # "32" | "bf16"
    accelerator: str  # "cpu" | "gpu": where the profile trains


def profile_facts(name: str) -> ProfileFacts:
    """The profile's settings as the bench uses them; cifar10 reads the same in-memory path from synthetic data."""
    settings = BASE[name]
    data = {k[5:]: v for k, v in settings.items() if k.startswith("data.") and k not in ("data.root", "data.download")}
    if data["name"] == "cifar10":  # same shape, same in-memory loader and augmentation, no download
        data["name"] = "synthetic"
    dm = ImageDataModule(**{**data, "root": "."}) if data["name"] != "imagefolder" else None
    return ProfileFacts(
        name=name, data=data, variant=settings["model.variant"], patch_size=settings["model.patch_size"],
        img_size=dm.img_size if dm else data["img_size"], in_chans=dm.in_chans if dm else 3,
        num_classes=dm.num_classes if dm else 1000, batch_size=data["batch_size"],
        num_workers=data.get("num_workers", 0),
        precision="bf16" if str(settings.get("trainer.precision", "32")).startswith("bf16") else "32",
        accelerator=settings.get("trainer.accelerator", "cpu"),
    )


def write_jpegs(root: Path, images: int, classes: int = 4, size: tuple[int, int] = JPEG_SIZE) -> float:
    """An imagefolder of ImageNet-sized JPEGs (smooth colour fields with noise) in root/{train,val}; mean KiB."""
    from PIL import Image

    sizes = []
    for split, count in (("train", images), ("val", classes)):
        for i in range(count):
            folder = root / split / f"class{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            rng = np.random.default_rng(i)
            coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
            smooth = np.asarray(coarse.resize(size, Image.BICUBIC), dtype=np.float32)
            pixels = np.clip(smooth + rng.normal(0, 8, smooth.shape), 0, 255).astype(np.uint8)
            path = folder / f"{i}.jpg"
            Image.fromarray(pixels).save(path, quality=90)
            sizes.append(path.stat().st_size)
    return float(np.mean(sizes)) / 1024


def loader_rate(facts: ProfileFacts, images: int, root: Path, decode_on: str = "cpu") -> float:
    """Training images/s of the profile's loader run in this process with one thread, as one worker runs it
    (decode_on=device: the worker that only reads the files' bytes)."""
    dm = ImageDataModule(**{**facts.data, "root": str(root), "num_workers": 0, "decode_on": decode_on})
    dm.setup("fit")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # DataLoader workers run with one thread each
    try:
        batches = iter(dm.train_dataloader())
        next(batches)  # warm-up: first file reads, lazy imports
        seen, start = 0, time.perf_counter()
        while seen < images:
            x, _ = next(batches, (None, None))
            if x is None:
                batches = iter(dm.train_dataloader())
                continue
            seen += len(x)
        return seen / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def device_decode_rate(facts: ProfileFacts, images: int, root: Path, device: torch.device) -> float:
    """Training images/s of decoding on `device`: a batch of the profile's read bytes decoded, cropped, flipped,
    RandAugmented and normalised there, over and over (host time included, as the training loop waits for it)."""
    dm = ImageDataModule(**{**facts.data, "root": str(root), "num_workers": 0, "decode_on": "device"})
    dm.setup("fit")
    encoded = next(iter(dm.train_dataloader()))[0].to(device)
    dm.train_collate.finish(encoded)  # warm-up: nvJPEG's state, first kernels
    sync(device)
    seen, start = 0, time.perf_counter()
    while seen < images:
        dm.train_collate.finish(encoded)
        seen += len(encoded)
    sync(device)
    return seen / (time.perf_counter() - start)


def folder_rates(facts: ProfileFacts, images: int, root: Path, device: torch.device, step: float | None) -> dict:
    """An image folder's loader per worker decoding in PIL and reading bytes only, and where the profile decodes on
    `device` (its data.decode_on); with its `step` measured there and decoding there: that decode's rate and the
    step slowed by it, which the byte-reading workers must feed."""
    out = {"per_worker_images_per_s": loader_rate(facts, images, root),
           "bytes_per_worker_images_per_s": loader_rate(facts, images, root, decode_on="device"),
           "decode_on": decode_place(facts.data.get("decode_on", "auto"), device, in_memory=False)}
    if step is not None and out["decode_on"] == "device":
        decode = device_decode_rate(facts, images, root, device)
        fed = 1 / (1 / step + 1 / decode)  # the training loop decodes each batch on the device before its step
        out.update(device_decode_images_per_s=decode, step_images_per_s=fed)
    return out


def workers_needed(step_images_per_s: float, per_worker_images_per_s: float) -> int:
    """Loader workers that together deliver at least what the training step consumes."""
    return max(1, math.ceil(step_images_per_s / per_worker_images_per_s))


def feed_warning(facts: ProfileFacts, per_worker: float, step: float, cores: int) -> str | None:
    """One line when the profile's loader cannot keep up with its training step, else None."""
    need = workers_needed(step, per_worker)
    if facts.num_workers == 0:
        share = step / per_worker  # loading runs in the training process, between steps
        if share <= 0.1:
            return None
        return (f"{facts.name}: loading in the training process adds {share:.0%} to each step "
                f"({per_worker:,.0f} img/s vs a {step:,.0f} img/s step); set --data.num_workers={need}")
    if need <= facts.num_workers:
        return None
    fix = f"--data.num_workers={need}" if need <= cores else f"{need} workers but this machine has {cores} cores"
    return (f"{facts.name}: the loader cannot keep up: {per_worker:,.0f} img/s per worker x {facts.num_workers} "
            f"workers < {step:,.0f} img/s training step; needs {fix}")
