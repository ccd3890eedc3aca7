"""The training loader's place in its epoch (data/resumable.py): saved, restored, and under DDP each rank's shard
resumes so that the ranks together train each image of the cut epoch once; Lightning keeps its sampler; loader
workers draw a batch's random numbers by its place in the epoch, and without workers nothing of that path runs."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from vit_lightning.data.datamodule import ImageDataModule
from vit_lightning.data.resumable import PlacedDraws, ResumableLoader, ResumableSampler

N, BATCH = 50, 4  # 50 images over 2 ranks: 25 each, 7 batches per rank (the last one short)


class FakeTrainer:
    """What train_dataloader reads of a trainer: its DDP layout, and the epoch's progress a checkpoint records."""

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.global_rank, self.done = world_size, rank, (0, False)


def loader(ranks: int, rank: int, state: dict | None = None, seed: int = 3) -> ResumableLoader:
    data = TensorDataset(torch.arange(N))
    sampler = ResumableSampler(data, num_replicas=ranks, rank=rank, seed=seed)
    out = ResumableLoader(data, batch_size=BATCH, sampler=sampler, progress=lambda: loader.done[rank])
    if state is not None:
        out.load_state_dict(state)
    return out


def epoch(dl: DataLoader, e: int) -> list[list[int]]:
    dl.sampler.set_epoch(e)  # as Lightning does at each epoch start
    return [batch[0].tolist() for batch in dl]


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("cut", [1, 3, 6])
def test_a_resumed_epoch_trains_what_the_cut_one_had_left_on_every_rank(ranks, cut):
    unbroken = [[epoch(loader(ranks, r), e) for e in range(3)] for r in range(ranks)]
    seen, states = [], []
    for r in range(ranks):
        first = loader(ranks, r)
        part = epoch(first, 0)  # epoch 0 whole, then epoch 1 stopped after `cut` batches
        part = epoch(first, 1)[:cut]
        loader.done = {r: (cut, False)}
        states.append(first.state_dict())
        seen.append(part)
    assert states[0] == {"epoch": 1, "batches": cut, "finished": False}
    for r in range(ranks):
        again = loader(ranks, r, states[r])
        rest = epoch(again, 1)
        assert seen[r] + rest == unbroken[r][1]  # image for image, in the unbroken order
        assert epoch(again, 2) == unbroken[r][2]  # and the next epoch starts at its beginning
    # the ranks together: each image of the cut epoch once (DistributedSampler pads to an even split: N is even)
    images = sorted(i for r in range(ranks) for b in unbroken[r][1] for i in b)
    assert images == list(range(N))


def test_a_checkpoint_at_an_epoch_end_resumes_at_the_next_epoch_start():
    first = loader(1, 0)
    epoch(first, 0)
    loader.done = {0: (13, True)}
    again = loader(1, 0, first.state_dict())
    assert again.sampler.epoch == 1 and epoch(again, 1) == epoch(loader(1, 0), 1)


def test_the_datamodule_gives_each_rank_its_shard_and_lightning_keeps_the_sampler(tmp_path):
    dm = ImageDataModule(name="synthetic", batch_size=BATCH, img_size=8)
    dm.prepare_data()
    dm.setup("fit")
    shards = []
    for rank in range(2):
        dm.trainer = FakeTrainer(2, rank)
        dl = dm.train_dataloader()
        assert isinstance(dl, ResumableLoader) and (dl.sampler.num_replicas, dl.sampler.rank) == (2, rank)
        shards.append(set(dl.sampler))
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == len(dm.train_set)
    ddp = pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False,
                     default_root_dir=tmp_path)
    connector = ddp._data_connector
    assert not connector._requires_distributed_sampler(dl)  # ours stays: its state is the checkpoint's
    assert connector._requires_distributed_sampler(DataLoader(dm.train_set, batch_size=BATCH, shuffle=True))


class Drawing(torch.utils.data.Dataset):
    """Each read draws from the reading process's torch generator, as a random transform does: (key, draw)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, key: int) -> tuple[int, float]:
        return key, float(torch.rand(()))


def drawn_epoch(workers: int, e: int, cut: int = 0, ranks: int = 1, rank: int = 0) -> list[tuple[list, list]]:
    """(keys, draws) of each batch of epoch `e` that a fresh loader with `workers` reads after `cut` trained batches."""
    sampler = ResumableSampler(Drawing(), num_replicas=ranks, rank=rank, seed=7)
    dl = ResumableLoader(Drawing(), batch_size=BATCH, sampler=sampler, num_workers=workers)
    dl.load_state_dict({"epoch": e, "batches": cut, "finished": False})
    dl.sampler.set_epoch(e)
    return [(keys.tolist(), draws.tolist()) for keys, draws in dl]


def test_with_workers_a_batch_draws_by_its_place_whichever_worker_reads_it_and_after_a_resume():
    unbroken = drawn_epoch(2, 1)
    assert drawn_epoch(1, 1) == unbroken  # another worker reads each batch: the same draws
    assert drawn_epoch(2, 1, cut=3) == unbroken[3:]  # a resume starts in another worker: the same draws
    assert drawn_epoch(2, 2) != unbroken and drawn_epoch(2, 1, ranks=2, rank=1) != unbroken[:4]
    draws = [d for _, batch in unbroken for d in batch]
    assert len(set(draws)) == N  # every read drew anew


def test_without_workers_the_loader_reads_plain_keys_and_draws_from_the_process_generators():
    """workers=0 (every committed record) keeps the earlier path: the dataset itself, plain keys, and the draws of
    this process's generator in reading order, which the checkpoint carries (run/callbacks.py EpochSeed)."""
    sampler = ResumableSampler(Drawing(), seed=7)
    # the private generator EpochSeed gives the loader: making the iterator draws its base seed from it
    dl = ResumableLoader(Drawing(), batch_size=BATCH, sampler=sampler, num_workers=0,
                         generator=torch.Generator().manual_seed(0))
    assert not isinstance(dl.dataset, PlacedDraws) and all(type(k) is int for k in sampler)
    torch.manual_seed(11)
    read = [(k, d) for keys, draws in dl for k, d in zip(keys.tolist(), draws.tolist())]
    torch.manual_seed(11)
    assert [d for _, d in read] == [float(torch.rand(())) for _ in range(N)]
    assert [k for k, _ in read] == list(sampler)  # the sampler's order


def test_a_loader_lightning_makes_again_with_its_own_sampler_reads_plain_keys_and_saves_no_place():
    """trainer.overfit_batches: Lightning rebuilds the training loader from its attributes with a SequentialSampler."""
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    placed = ResumableLoader(Drawing(), batch_size=BATCH, sampler=ResumableSampler(Drawing(), seed=7), num_workers=2)
    again = _update_dataloader(placed, torch.utils.data.SequentialSampler(placed.dataset), mode=RunningStage.TRAINING)
    assert type(again.dataset) is Drawing and again.num_workers == 2
    assert [k for keys, _ in again for k in keys.tolist()] == list(range(N))
    assert again.state_dict() == {}
    again.load_state_dict({})  # a checkpoint of such a run resumes without a place
