"""A training loader that knows its place in the epoch, so a run resumed mid-epoch trains each image of that
epoch once: the images the stopped attempt had left, in the order it would have seen them.

The order of an epoch is a function of (seed, epoch) alone (a DistributedSampler's, one shard per DDP rank;
Lightning keeps a DistributedSampler as it is), and so are its images where the dataset draws new ones every epoch
(its `per_epoch`: the sampler hands it keys epoch * len + index). Lightning saves the loader's `state_dict` in the checkpoint
(the epoch and the batches trained in it) and hands it back to `load_state_dict` before it makes the resumed
epoch's iterator, which then starts after those batches (or, when the loader was built before the checkpoint
was read, ResumeLoader hands it back at the start of training). Any worker count: the sampler runs in the main
process.

A batch's random draws resume as its images do. Without loader workers the collate draws from the training
process's generators, which the checkpoint carries (run/callbacks.py EpochSeed). Workers have generators of their
own that no checkpoint holds, and which worker reads a batch depends on where the iterator started; so with workers
each key travels with its place in the epoch, and the worker seeds its generators from (run seed, epoch, rank, the
batch's first position) before it reads the batch (PlacedDraws): a batch draws the same numbers whichever worker
reads it, in an unbroken run or a resumed one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from typing_extensions import override

from vit_lightning.compat.lightning import restore_loader_states


class ResumableSampler(DistributedSampler):
    """A seeded shuffle per epoch (this rank's shard of it) that starts an epoch after its first `skip` indices."""

    def __init__(self, dataset, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0  # indices of the current epoch already trained (set by ResumableLoader.load_state_dict)
        self.places = False  # yield (key, place) pairs: set by ResumableLoader when workers read the batches

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # another epoch than the one being resumed starts at its beginning
            self.skip = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        if getattr(self.dataset, "per_epoch", False):  # new images every epoch: the key names the epoch too
            indices = [self.epoch * len(self.dataset) + i for i in indices]
        skip, self.skip = self.skip, 0
        if self.places:  # a place is (seed, epoch, rank, position in this rank's epoch): what PlacedDraws seeds from
            return iter([(key, (self.seed, self.epoch, self.rank, n)) for n, key in enumerate(indices)][skip:])
        return iter(indices[skip:])


class PlacedDraws(Dataset):
    """A dataset read by loader workers from (key, place) pairs: before each batch (or lone sample) the worker's
    generators are seeded from its first place, so its random transforms and the collate's augmentation draw what
    that place draws in any worker and in any attempt of the run."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        key, place = item
        seed_generators(place)
        return self.dataset[key]

    def __getitems__(self, items: list) -> list:
        seed_generators(items[0][1])
        return [self.dataset[key] for key, _ in items]


def seed_generators(place: tuple[int, ...]) -> None:
    """Seed this process's Python, NumPy and torch CPU generators from a place (a tuple of whole numbers)."""
    high, low = np.random.SeedSequence([int(n) % 2**64 for n in place]).generate_state(2)
    seed = int(high) << 32 | int(low)
    random.seed(seed)
    np.random.seed(int(low))
    torch.manual_seed(seed)


class ResumableLoader(DataLoader):
    """A DataLoader over a ResumableSampler whose state (epoch, batches trained in it) travels in the checkpoint.

    `progress()` gives (batches trained in the current epoch, whether the epoch is over) when the state is taken.
    """

    def __init__(self, dataset, *args, progress: Callable[[], tuple[int, bool]] | None = None, **kwargs):
        sampler = kwargs.get("sampler")
        dataset = dataset.dataset if isinstance(dataset, PlacedDraws) else dataset  # made again from its attributes
        if isinstance(sampler, ResumableSampler):  # workers draw by place; without them, this process draws
            sampler.places = kwargs.get("num_workers", 0) > 0
            dataset = PlacedDraws(dataset) if sampler.places else dataset
        super().__init__(dataset, *args, **kwargs)
        self.progress = progress

    def state_dict(self) -> dict:
        if not isinstance(self.sampler, ResumableSampler):  # Lightning gave it another (trainer.overfit_batches)
            return {}
        batches, finished = self.progress() if self.progress is not None else (0, False)
        return {"epoch": self.sampler.epoch, "batches": batches, "finished": finished}

    def load_state_dict(self, state: dict) -> None:
        if not state or not isinstance(self.sampler, ResumableSampler):  # no place saved, or none to restore
            return
        finished = bool(state["finished"])
        self.sampler.epoch = int(state["epoch"]) + finished  # a finished epoch resumes at the next one's start
        self.sampler.skip = 0 if finished else int(state["batches"]) * self.batch_size


class ResumeLoader(pl.Callback):
    """At the start of a resumed fit: the loader's state from the checkpoint, if Lightning has not applied it."""

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        restore_loader_states(trainer)


def run_seed() -> int:
    """The run's seed as Lightning's seed_everything left it (0 without one): the shuffle's base seed."""
    try:
        return int(os.environ.get("PL_GLOBAL_SEED") or 0)
    except ValueError:
        return 0
