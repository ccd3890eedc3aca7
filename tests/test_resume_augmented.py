"""A run stopped mid-epoch with augmentation, mixing and dropout on resumes to the unbroken run: the same weights
and the same whole history (the cut epoch's train/loss and train/acc average all its batches), with loader workers
augmenting the batches too."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from test_sweep_signals import start_sweep, sweep_file, training
from tiny import TINY_MODEL, wait_for

from vit_lightning.commands.fit import main as train
from vit_lightning.commands.sweep.supervise import descendants
from vit_lightning.run.module import Classifier

pytestmark = pytest.mark.slow

AUGMENTED = ["--data.random_crop=true", "--data.flip=true", "--data.randaugment=true", "--data.mixup_alpha=0.4",
             "--model.dropout=0.2", "--model.drop_path=0.2", "--seed_everything=3"]
TINY = [*TINY_MODEL, "--data.batch_size=8", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1",
        "--trainer.max_epochs=3", "--run.fewshot_shots=[]", "--run.wandb=off", "--trainer.log_every_n_steps=1"]
TIMES = ("seconds", "images_per_s", "time")  # history entries that measure time, not training


def sigterm_at(step: int):
    def hook(self, outputs, batch, batch_idx):
        if self.global_step == step:
            os.kill(os.getpid(), signal.SIGTERM)
    return hook


def outcome(root) -> tuple[dict, list]:
    """(the last checkpoint's weights, the record's history without its timings) of the one run under root."""
    [record] = root.glob("*/*/*/results.json")
    weights = torch.load(record.parent / "last.ckpt", weights_only=True, map_location="cpu")["state_dict"]
    history = [{k: v for k, v in h.items() if not any(t in k for t in TIMES)}
               for h in json.loads(record.read_text())["history"]]
    return weights, history


@pytest.mark.parametrize("augment, workers", [("cpu", 0), ("device", 0), ("cpu", 2)])
def test_a_sigterm_mid_epoch_resumes_to_the_unbroken_run_with_augmentation_on(tmp_path, monkeypatch, augment, workers):
    """augment_on=cpu with 2 workers: the workers augment, and the resumed attempt's batches go to other workers."""
    args = [*TINY, *AUGMENTED, f"--data.augment_on={augment}", f"--data.num_workers={workers}"]
    assert train.main([*args, f"--run.root={tmp_path / 'a'}"]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(Classifier, "on_train_batch_end", sigterm_at(7), raising=False)  # epoch 1, batch 2 of 5
        assert train.main([*args, f"--run.root={tmp_path / 'b'}"]) == 128 + signal.SIGTERM
    assert train.main([*args, f"--run.root={tmp_path / 'b'}"]) == 0
    (unbroken, whole), (resumed, history) = outcome(tmp_path / "a"), outcome(tmp_path / "b")
    assert history == whole
    assert unbroken.keys() == resumed.keys()
    assert all(torch.equal(unbroken[k], resumed[k]) for k in unbroken), [k for k in unbroken
                                                                          if not torch.equal(unbroken[k], resumed[k])]


def test_a_trial_resumed_after_its_sweep_was_killed_mid_epoch_trains_the_unbroken_run(tmp_path):
    """SIGKILL of the sweep mid-epoch: its trial stops itself with a checkpoint, and the re-run sweep finishes it with
    the weights and the history of the same trial in a sweep nobody stopped."""
    fixed = {"data.random_crop": True, "data.flip": True, "data.randaugment": True, "data.cutmix_alpha": 0.5,
             "model.dropout": 0.2, "seed_everything": 5}
    epochs, batches = 2, 30
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    unbroken = start_sweep(sweep_file(whole, epochs, batches, lrs=(0.001,), **fixed), whole / "sweep.log")
    path = sweep_file(cut, epochs, batches, lrs=(0.001,), **fixed)
    sweep = start_sweep(path, cut / "sweep.log")
    try:
        wait_for(lambda: training(cut), 180, "no trial trained")
        below = descendants(sweep.pid)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in below), 60, "the trial outlived its sweep")
    finally:
        for pid in descendants(sweep.pid):
            os.kill(pid, signal.SIGKILL)
    [record] = (cut / "runs").glob("*/*/*/results.json")
    assert json.loads(record.read_text())["status"] == "interrupted", "the trial ended before its sweep was killed"
    assert list(record.parent.glob("hpc_ckpt_*.ckpt"))  # stopped mid-epoch, at a step
    assert start_sweep(path, cut / "sweep.log").wait(timeout=600) == 0, (cut / "sweep.log").read_text()[-3000:]
    assert unbroken.wait(timeout=600) == 0, (whole / "sweep.log").read_text()[-3000:]
    (weights, history), (resumed, again) = outcome(whole / "runs"), outcome(cut / "runs")
    assert again == history and len(history) == epochs
    assert weights.keys() == resumed.keys() and all(torch.equal(weights[k], resumed[k]) for k in weights)
