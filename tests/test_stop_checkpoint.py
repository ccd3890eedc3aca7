"""A stop (SIGTERM) checkpoints at the step it stopped at, and the same command resumes mid-epoch from there."""

import csv
import json
import os
import signal

import pytest
from tiny import TINY_MODEL

from vit_lightning.commands.fit import main as train
from vit_lightning.run import rundir
from vit_lightning.run.module import Classifier

TINY = [*TINY_MODEL, "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2", "--run.fewshot_shots=[]",
        "--trainer.log_every_n_steps=1", "--trainer.max_epochs=2"]


def sigterm_at_step_8(self, outputs, batch, batch_idx):
    if self.global_step == 8:  # epoch 1, batch 2 of 6
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_sigterm_checkpoints_mid_epoch_and_the_resume_trains_every_step_once(tmp_path, monkeypatch, capsys):
    args = [*TINY, f"--run.root={tmp_path}"]
    with monkeypatch.context() as patch:
        patch.setattr(Classifier, "on_train_batch_end", sigterm_at_step_8, raising=False)
        assert train.main(args) == 128 + signal.SIGTERM
    [record_path] = tmp_path.glob("*/*/*/results.json")
    run_dir = record_path.parent
    stopped = json.loads(record_path.read_text())
    assert stopped["status"] == "interrupted" and [h["epoch"] for h in stopped["history"]] == [0]
    [hpc] = run_dir.glob("hpc_ckpt_*.ckpt")
    assert rundir.resume_point(run_dir) == hpc
    assert "stopped by SIGTERM at step 9" in capsys.readouterr().out  # the first step to end after the signal

    assert train.main(args) == 0  # resumes mid-epoch 1 (EpochPrinter: stdout is no terminal here)
    record = json.loads(record_path.read_text())
    assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == [0, 1]
    with (run_dir / "metrics.csv").open(newline="") as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss_step")]
    assert steps == list(range(12))  # every step once: none lost at the stop, none repeated after it
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))
    # throughput over the steps trained (48 + ... images in well under a minute), not since the machine booted
    assert record["compute"]["train_images_per_s"] > 20
