"""`vit-ablate fit` when things go wrong: signals, a busy run dir, corrupt files, a full or read-only disk, bad input."""

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest

from vit_lightning.commands.fit import cli as fitcli
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.sweep import cli as sweep_cli
from vit_lightning.run import rundir

pytestmark = pytest.mark.slow  # every test here trains or starts processes that do

# Sends this process (rank SIGNAL_RANK) a signal when epoch 1 starts (like a pre-empting scheduler, or Ctrl-C).
SIGNAL_AT_EPOCH_1 = r"""
import os, sys
from vit_lightning.commands.fit import main as train
from vit_lightning.run.module import Classifier

def on_train_epoch_start(self):
    if self.current_epoch == 1 and self.global_rank == int(os.environ.get("SIGNAL_RANK", "0")):
        os.kill(os.getpid(), int(os.environ["SEND_SIGNAL"]))

Classifier.on_train_epoch_start = on_train_epoch_start
sys.exit(train.main(sys.argv[1:]))
"""


def error_lines(text: str) -> list[str]:
    """Our own lines on stderr (Lightning's info lines aside)."""
    return [line for line in text.splitlines() if line.startswith("vit-ablate") or "Traceback" in line]


# --- signals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_fit_as_interrupted_and_the_same_command_resumes(sig, tmp_path, monkeypatch, tiny_fit, only_record):
    script = tmp_path / "signal_at_epoch_1.py"
    script.write_text(SIGNAL_AT_EPOCH_1)
    argv = [*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=2", f"--run.root={tmp_path / 'runs'}"]
    env = {**os.environ, "SEND_SIGNAL": str(int(sig)), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 128 + sig, done.stderr[-3000:]
    path, record = only_record(tmp_path / "runs")
    assert record["status"] == "interrupted" and record["error"] == f"stopped by {sig.name}"
    assert [h["epoch"] for h in record["history"]] == [0]
    # SIGTERM stops at a training step with a checkpoint there; Ctrl-C (anywhere) resumes from epoch 0's last.ckpt
    resume = "hpc_ckpt_1.ckpt" if sig == signal.SIGTERM else "last.ckpt"
    assert error_lines(done.stderr) == [f"vit-ablate fit: stopped by {sig.name}; the same command resumes from "
                                        f"{tmp_path / 'runs'}/{path.parent.relative_to(tmp_path / 'runs')}/{resume}"]
    monkeypatch.chdir(tmp_path)
    assert train.main(argv) == 0  # no flag needed: an interrupted run is not a failed one
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == [0, 1]


@pytest.mark.ddp
def test_sigterm_to_one_ddp_rank_stops_both_at_the_same_step(tmp_path, tiny_fit, only_record):
    script = tmp_path / "signal_at_epoch_1.py"
    script.write_text(SIGNAL_AT_EPOCH_1)
    env = {**os.environ, "SEND_SIGNAL": str(int(signal.SIGTERM)), "SIGNAL_RANK": "1", "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "disabled"}
    argv = [sys.executable, str(script), *tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=2", "--trainer.devices=2",
            "--trainer.strategy=ddp", "--run.ddp_timeout_s=60"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM and "Traceback" not in done.stderr, done.stderr[-3000:]
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "interrupted" and [h["epoch"] for h in record["history"]] == [0]


# --- one writer per run dir ------------------------------------------------------------------------------
def test_fit_leaves_a_run_dir_that_another_process_trains_alone(tmp_path, capsys, tiny_fit):
    argv = [*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=1", f"--run.root={tmp_path / 'runs'}", "--run.retrain=true"]
    directory = fitcli.FitCLI(argv).run_dir
    directory.mkdir(parents=True)
    for name in ("last.ckpt", "metrics.csv"):  # another process's files: a fresh start would delete them
        (directory / name).write_text("theirs")
    held = rundir.acquire(directory)
    try:
        assert train.main(argv) == rundir.BUSY
    finally:
        rundir.release(held)
    assert error_lines(capsys.readouterr().err) == [
        f"vit-ablate fit: error: {directory} is being trained by pid {os.getpid()} on {os.uname().nodename}; "
        "not started: a run dir has one writer at a time"]
    assert {p.name: p.read_text() for p in directory.iterdir() if p.name != rundir.LOCK} == {
        "last.ckpt": "theirs", "metrics.csv": "theirs"}


# --- corrupt files -----------------------------------------------------------------------------------------
def test_truncated_record_and_checkpoint_are_set_aside_and_the_run_goes_on(tmp_path, monkeypatch, capsys, tiny_fit, only_record):
    monkeypatch.chdir(tmp_path)
    argv = [*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=1"]
    assert train.main(argv) == 0
    path, first = only_record(tmp_path / "runs")
    path = path.relative_to(tmp_path)  # as fit names it: under the relative run root
    capsys.readouterr()

    truncated = path.read_text()[:100]
    path.write_text(truncated)  # the run's last.ckpt is still good
    assert train.main(argv) == 0
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"vit-ablate fit: {path} was unreadable (JSONDecodeError: ") and line.endswith(
        "moved to results.json.corrupt; resumed from last.ckpt")
    _, second = only_record(tmp_path / "runs")
    assert second["status"] == "completed" and second["history"] == first["history"]  # carried by the checkpoint
    assert second["recovery"] == line.removeprefix("vit-ablate fit: ")
    assert (path.parent / "results.json.corrupt").read_text() == truncated

    ckpt = path.parent / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])  # truncated mid-write
    path.unlink()  # not finished, so the run must go on from its checkpoint
    assert train.main(argv) == 0
    [line] = error_lines(capsys.readouterr().err)
    assert line == (f"vit-ablate fit: {ckpt} was unreadable (BadZipFile: File is not a zip file), moved to "
                    "last.ckpt.corrupt; trained from scratch")
    _, third = only_record(tmp_path / "runs")
    assert third["status"] == "completed" and third["history"] == first["history"]  # same seed, same numbers
    assert third["recovery"].endswith("trained from scratch") and (path.parent / "last.ckpt.corrupt").is_file()


def test_table_skips_truncated_records_and_names_them(tmp_path, capsys):
    from vit_lightning.commands.results import cli as table_cli

    run = tmp_path / "runs" / "pos_encoding" / "demo" / "a-run"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"name": "a-run", "sta')
    records = tmp_path / "out" / "records"
    records.mkdir(parents=True)
    (records / "b-run.json").write_text('{"name": "b-run", "status": "comp')
    assert table_cli.main(["pos_encoding", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"skipping {run / 'results.json'}: " in err
    assert f"skipping {records / 'b-run.json'}: unreadable (" in err and "Traceback" not in err


# --- the disk ---------------------------------------------------------------------------------------------
def test_a_read_only_run_root_is_one_line(readonly_dir, tmp_path, monkeypatch, capfd, tiny_fit):
    monkeypatch.chdir(tmp_path)
    assert train.main([*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=1", f"--run.root={readonly_dir / 'runs'}"]) == 1
    lines = error_lines(capfd.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"vit-ablate fit: error: cannot write the run dir: {readonly_dir}")
    assert not any(readonly_dir.iterdir())


def test_a_full_disk_fails_the_run_with_its_reason_and_no_temp_files(small_disk, tmp_path, monkeypatch, capfd, tiny_fit, only_record):
    root, mounted = small_disk
    if not mounted:  # the checkpoint (the big write) cannot be written, as on a full disk
        from vit_lightning.run import rundir

        def no_space(path, data):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(rundir, "write_atomic", no_space)
    monkeypatch.chdir(tmp_path)
    assert train.main([*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.max_epochs=1", f"--run.root={root / 'runs'}"]) == 1
    path, record = only_record(root / "runs")
    assert record["status"] == "failed" and record["error"] == "OSError: [Errno 28] No space left on device"
    assert error_lines(capfd.readouterr().err) == [
        f"vit-ablate fit: error: No space left on device (in {path.parent}); fix that and "
        "run the same command again to resume"]
    assert not list(root.rglob("*.tmp")) and not (path.parent / "last.ckpt").exists()


# --- bad input, refused before anything is written -----------------------------------------------------------
@pytest.mark.parametrize("option", ["--run.ablation=../x", "--run.profile=/tmp/elsewhere", "--run.trial=.hidden",
                                    "--trainer.max_epochs=0", "--trainer.max_steps=0", "--run.ddp_timeout_s=0"])
def test_fit_refuses_in_one_line(option, tmp_path, capsys):
    assert train.main([option, f"--run.root={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vit-ablate fit: error: ") and option[2:].split("=")[0] in err[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("setting", ["run.ablation=../esc", "run.profile=/tmp/x", "trainer.max_epochs=0"])
def test_sweep_refuses_in_one_line(setting, tmp_path, capsys):
    assert sweep_cli.main(["hybrid", "--dry-run", "--set", setting, "--set", f"run.root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and setting.split("=")[0] in err[0] and not any(tmp_path.iterdir())


@pytest.mark.ddp
def test_ddp_collective_timeout_is_set_from_the_run_option(tiny_fit):
    base = [*tiny_fit(2, 1, "--run.fewshot_shots=[]"), "--trainer.devices=2", "--trainer.strategy=ddp"]
    assert fitcli.FitCLI(base).trainer.strategy._timeout == timedelta(seconds=fitcli.DDP_TIMEOUT_S)
    assert fitcli.FitCLI([*base, "--run.ddp_timeout_s=7.5"]).trainer.strategy._timeout == timedelta(seconds=7.5)
