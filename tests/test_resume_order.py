"""What a mid-epoch resume trains: the images of each step of an interrupted-and-resumed run against an unbroken one."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import warnings
from pathlib import Path

import pytest
from lightning.pytorch import Callback
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train

pytestmark = pytest.mark.slow

EPOCHS, BATCHES, STOP_AT = 3, 6, (1, 2)  # stopped in epoch 1 (0-based) after its first 2 steps


class RecordSamples(Callback):
    """Appends each training step's (epoch, batch, image ids) to $RECORD_SAMPLES; SIGTERM itself at $STOP_AT."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        x = batch[0]  # mnist5k without augmentation: an image's pixels name it
        ids = [hashlib.sha1(image.numpy().tobytes()).hexdigest()[:12] for image in x]
        with open(os.environ["RECORD_SAMPLES"], "a") as out:
            out.write(json.dumps([trainer.current_epoch, batch_idx, ids, trainer.global_rank]) + "\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if os.environ.get("STOP_AT") == f"{trainer.current_epoch},{batch_idx + 1}":
            os.environ.pop("STOP_AT")
            os.kill(os.getpid(), signal.SIGTERM)  # fit's stop signal: a checkpoint at this step


def steps(root, *env: tuple[str, str], code: int = 0, more=()) -> list:
    path = root / "samples.jsonl"
    os.environ.update({"RECORD_SAMPLES": str(path), **dict(env)})
    argv = [*TINY_MODEL, *more, "--data.batch_size=8", f"--trainer.limit_train_batches={BATCHES}",
            "--trainer.limit_val_batches=1", f"--trainer.max_epochs={EPOCHS}", "--run.fewshot_shots=[]",
            "--run.wandb=off", f"--run.root={root}", "--trainer.callbacks=test_resume_order.RecordSamples"]
    assert train.main(argv) == code
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_mid_epoch_resume_trains_each_image_of_the_cut_epoch_once_in_the_unbroken_order(tmp_path, monkeypatch):
    """README, "When things go wrong": a run stopped mid-epoch resumes where it stopped, measured image by image:
    the loader's place in the epoch travels in the checkpoint (data/resumable.py)."""
    monkeypatch.setenv("RECORD_SAMPLES", "")
    unbroken = steps(tmp_path / "a")
    stopped = steps(tmp_path / "b", ("STOP_AT", ",".join(map(str, STOP_AT))), code=128 + signal.SIGTERM)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = steps(tmp_path / "b")[len(stopped):]
    assert not [w for w in caught if "not resumable" in str(w.message)]  # Lightning's warning for a plain loader
    assert [s[:2] for s in stopped + resumed] == [s[:2] for s in unbroken]  # every step once, in order
    images = {tuple(s[:2]): s[2] for s in unbroken}
    epoch, done = STOP_AT
    assert all(images[tuple(s[:2])] == s[2] for s in stopped)  # up to the stop: the unbroken run's images
    rest = [s for s in resumed if s[0] == epoch]
    assert len(rest) == BATCHES - done
    # the rest of the interrupted epoch: the batches the epoch had left, image for image
    assert [s[2] for s in rest] == [images[(epoch, b)] for b in range(done, BATCHES)]
    # so each image of the cut epoch is trained once: before the stop or after it, never both, none left out
    cut = [i for s in stopped + resumed if s[0] == epoch for i in s[2]]
    assert sorted(cut) == sorted(i for b in range(BATCHES) for i in images[(epoch, b)]) and len(set(cut)) == len(cut)
    # every later epoch: exactly the unbroken run's images, step by step
    later = [s for s in resumed if s[0] > epoch]
    assert later and all(images[tuple(s[:2])] == s[2] for s in later)


@pytest.mark.ddp
def test_under_ddp_each_rank_resumes_its_shard_and_the_ranks_train_each_image_of_the_cut_epoch_once(
        tmp_path, monkeypatch):
    """Two CPU processes: each rank's loader keeps its own shard of the epoch, saved and restored with it."""
    monkeypatch.setenv("RECORD_SAMPLES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    here = str(Path(__file__).parent)  # the ranks are processes of their own: they import RecordSamples from here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    ddp = ["--trainer.devices=2", "--trainer.strategy=ddp"]
    unbroken = steps(tmp_path / "a", more=ddp)
    stopped = steps(tmp_path / "b", ("STOP_AT", ",".join(map(str, STOP_AT))), code=128 + signal.SIGTERM, more=ddp)
    resumed = steps(tmp_path / "b", more=ddp)[len(stopped):]
    epoch, done = STOP_AT
    for rank in (0, 1):
        mine = [s for s in unbroken if s[3] == rank]
        images = {tuple(s[:2]): s[2] for s in mine}
        rest = [s[2] for s in resumed if s[3] == rank and s[0] == epoch]
        assert rest == [images[(epoch, b)] for b in range(done, BATCHES)], rank
    cut = [i for s in stopped + resumed if s[0] == epoch for i in s[2]]
    whole = [i for s in unbroken if s[0] == epoch for i in s[2]]
    assert sorted(cut) == sorted(whole) and len(set(cut)) == len(cut) == 2 * BATCHES * 8
