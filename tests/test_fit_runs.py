"""The run lifecycle of `vit-ablate fit`: resume, reproducibility, skip/retrain, divergence, checkpoints, W&B, DDP."""

import io
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone

import pytest
import torch
from tiny import TINY_MODEL

from vit_lightning.commands.fit import cli as fitcli
from vit_lightning.commands.fit import main as train
from vit_lightning.run import loggers
from vit_lightning.run.module import Classifier

pytestmark = pytest.mark.slow  # every test here trains or starts processes that do

TINY = [*TINY_MODEL, "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2"]
# Dropout, random crops and shuffling all draw random numbers: a resumed run must draw the same ones.
TWO_EPOCHS = [*TINY, "--trainer.max_epochs=2", "--model.dropout=0.1", "--model.warmup_epochs=0.5"]


def crash_at_epoch_1(self):
    if self.current_epoch == 1:
        raise RuntimeError("simulated crash\nwith a second line")


def test_resumed_run_matches_uninterrupted_and_same_seed_repeats(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    straight = [*TWO_EPOCHS, f"--run.root={tmp_path / 'a'}"]
    assert train.main(straight) == 0
    _, a = only_record(tmp_path / "a")
    assert a["status"] == "completed" and [h["epoch"] for h in a["history"]] == [0, 1]

    again = [*TWO_EPOCHS, f"--run.root={tmp_path / 'again'}"]
    assert train.main(again) == 0
    assert only_record(tmp_path / "again")[1]["history"] == a["history"]  # same seed, same numbers

    assert a["metrics"]["val/acc_best"] == max(h["val/acc"] for h in a["history"])  # the best epoch, not the last

    crashing = [*TWO_EPOCHS, f"--run.root={tmp_path / 'b'}"]
    began = datetime.now(timezone.utc).replace(microsecond=0)
    with monkeypatch.context() as patch:
        patch.setattr(Classifier, "on_train_epoch_start", crash_at_epoch_1, raising=False)
        with pytest.raises(RuntimeError, match="simulated crash"):
            train.main(crashing)
    path, b = only_record(tmp_path / "b")
    assert b["status"] == "failed" and b["error"] == "RuntimeError: simulated crash with a second line"
    assert [h["epoch"] for h in b["history"]] == [0] and (path.parent / "last.ckpt").is_file()

    assert train.main(crashing) == 0  # the identical command resumes from last.ckpt
    path_b, b = only_record(tmp_path / "b")
    assert path_b == path and b["status"] == "completed" and b["error"] is None
    assert b["history"] == a["history"]
    assert b["metrics"] == a["metrics"]
    # the first attempt's start is kept across the resume; both times lie within this test's calls
    started, finished = (datetime.fromisoformat(b[key]) for key in ("started_at", "finished_at"))
    assert began <= started <= finished <= datetime.now(timezone.utc)


def test_completed_run_is_skipped_unless_retrain(tmp_path, monkeypatch, capsys, only_record):
    monkeypatch.chdir(tmp_path)
    argv = [*TINY, "--trainer.max_epochs=1"]
    assert train.main(argv) == 0
    path, first = only_record(tmp_path / "runs")
    capsys.readouterr()
    assert train.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"vit-ablate fit: skipped, run already completed; record: {path.relative_to(tmp_path)}"]
    assert json.loads(path.read_text()) == first
    assert train.main([*argv, "--run.retrain=true"]) == 0  # same dir: retrain is not part of the run's identity
    path2, second = only_record(tmp_path / "runs")
    assert path2 == path and second["status"] == "completed" and second["history"] == first["history"]
    # header + val row + train row + few-shot row + shuffled-patch row: the retrain started a fresh metrics.csv
    assert len((path.parent / "metrics.csv").read_text().splitlines()) == 1 + 4


def test_checkpoint_loads_with_weights_only(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, "--trainer.max_epochs=1", "--model.pos_encoding=learned_2d",
                       "--model.hybrid_layers=[2, 2]"]) == 0
    path, _ = only_record(tmp_path / "runs")
    ckpt = torch.load(path.parent / "last.ckpt", weights_only=True, map_location="cpu")
    hp = ckpt["hyper_parameters"]
    assert hp["pos_encoding"] == "learned_2d" and hp["hybrid_layers"] == [2, 2] and hp["num_classes"] == 10
    model = Classifier(**hp)
    model.load_state_dict(ckpt["state_dict"])
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_non_finite_loss_stops_and_records_diverged(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    # lr 10 (the largest fit takes) with plain SGD and no clipping: the loss leaves the finite numbers within an epoch
    argv = [*TINY, "--trainer.max_epochs=3", "--trainer.limit_train_batches=20", "--model.lr=10", "--model.optimizer=sgd",
            "--trainer.gradient_clip_val=null", "--trainer.log_every_n_steps=1", "--model.warmup_epochs=0"]
    assert train.main(argv) == 0
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and record["metrics"]["epochs"] <= 1
    assert record["metrics"]["steps"] < 20 * 3
    json.dumps(record, allow_nan=False)  # NaN never reaches the JSON


def wandb_offline_env(tmp_path, monkeypatch) -> None:
    """A W&B-free environment in tmp_path: no mode, key, agent ids or user config from outside."""
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SWEEP_ID", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def test_wandb_offline_writes_a_local_run(tmp_path, monkeypatch, only_record):
    wandb_offline_env(tmp_path, monkeypatch)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert loggers.mode("auto") is None  # no agent, no credentials: off
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    assert loggers.mode("auto") == "offline"  # under an agent without credentials: offline
    monkeypatch.delenv("WANDB_SWEEP_ID")
    assert train.main([*TINY, "--trainer.max_epochs=1", "--run.wandb=offline", "--run.wandb_project=p"]) == 0
    path, record = only_record(tmp_path / "runs")
    assert record["wandb"]["run_id"] and record["wandb"]["project"] == "p"
    assert list((path.parent / "wandb").glob(f"offline-run-*-{record['wandb']['run_id']}"))


def test_wandb_resumed_fit_logs_to_the_same_run(tmp_path, monkeypatch, only_record):
    wandb_offline_env(tmp_path, monkeypatch)
    argv = [*TWO_EPOCHS, "--run.wandb=offline", "--run.wandb_project=p"]
    with monkeypatch.context() as patch:
        patch.setattr(Classifier, "on_train_epoch_start", crash_at_epoch_1, raising=False)
        with pytest.raises(RuntimeError, match="simulated crash"):
            train.main(argv)
    path, first = only_record(tmp_path / "runs")
    run_id = first["wandb"]["run_id"]
    assert first["status"] == "failed" and run_id
    assert train.main(argv) == 0  # resumes from last.ckpt, and the W&B run with it
    _, second = only_record(tmp_path / "runs")
    assert second["status"] == "completed" and second["wandb"]["run_id"] == run_id
    # one folder per attempt, named by time and run id (wandb appends -1 when both start in the same second)
    attempts = sorted((path.parent / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", folder.name)
                                      for folder in attempts)


@pytest.mark.ddp
def test_ddp_two_cpu_processes_write_one_record(tmp_path, monkeypatch, only_record):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # Called from Python, so fit runs as its own `vit-ablate fit` process, whose ranks get its argv.
    assert train.main([*TINY, "--trainer.max_epochs=2", "--trainer.devices=2", "--trainer.strategy=ddp"]) == 0
    path, record = only_record(tmp_path / "runs")
    assert record["status"] == "completed" and record["compute"]["num_devices"] == 2
    assert record["config"]["trainer.devices"] == 2 and len(record["history"]) == 2
    assert 0.0 < record["metrics"]["val/fewshot5"] <= 1.0  # computed on rank 0 while the other rank waited
    kept = sorted(p.name for p in path.parent.iterdir() if p.suffix in (".json", ".ckpt"))
    assert kept == ["last.ckpt", "results.json"]  # one record, one checkpoint
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # nothing else written, on any rank


# Rank 1 alone sees a NaN loss at its third step (its gradients stay finite, so rank 0's losses stay finite too).
NAN_ON_RANK_1 = r"""
import sys
from vit_lightning.commands.fit import main as train
from vit_lightning.run.module import Classifier

step = Classifier.training_step

def training_step(self, batch, batch_idx):
    loss = step(self, batch, batch_idx)
    return loss + float("nan") if self.global_rank == 1 and self.global_step == 2 else loss

def on_fit_end(self):
    with open(f"rank{self.global_rank}.steps", "w") as file:
        file.write(str(self.global_step))

Classifier.training_step, Classifier.on_fit_end = training_step, on_fit_end
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.ddp
def test_ddp_nan_on_one_rank_stops_every_rank(tmp_path, only_record):
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(NAN_ON_RANK_1)
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(script), *TINY, "--trainer.max_epochs=2", "--trainer.limit_train_batches=6",
            "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.log_every_n_steps=1"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)  # hangs if not
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "rank0.steps").read_text() == (tmp_path / "rank1.steps").read_text() == "3"  # of 12
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and record["metrics"]["steps"] == 3


def test_crash_before_training_is_recorded_as_failed(tmp_path, monkeypatch, only_record):
    from vit_lightning.data.datamodule import ImageDataModule

    monkeypatch.chdir(tmp_path)

    def broken_setup(self, stage=None):
        raise OSError("disk on fire")

    monkeypatch.setattr(ImageDataModule, "setup", broken_setup)
    with pytest.raises(OSError):
        train.main([*TINY, "--trainer.max_epochs=1"])
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "failed" and record["error"] == "OSError: disk on fire"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_progress_rich_in_a_terminal_plain_lines_in_logs(tty, tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import RichProgressBar

    monkeypatch.chdir(tmp_path)
    if tty:
        monkeypatch.setattr(sys, "stdout", _Terminal())
    cli = fitcli.FitCLI([*TINY, "--trainer.max_epochs=1"])
    kinds = {type(c) for c in cli.trainer.callbacks}
    assert (RichProgressBar in kinds) == tty and (fitcli.EpochPrinter in kinds) == (not tty)
    bar = cli.trainer.progress_bar_callback  # None: Lightning's TQDM bar is off
    assert isinstance(bar, RichProgressBar) if tty else bar is None
    assert list(tmp_path.iterdir()) == []  # building the CLI writes nothing
