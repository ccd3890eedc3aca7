"""Local backend with a stand-in for `vit-ablate fit` (no torch): resume, failures, retries, signals, slots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from vit_lightning.commands.sweep import cli, local


def test_runs_every_trial_then_skips_done_ones(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = stand_in.sweep()
    assert cli.main([sweep, "--backend", "local"]) == 0
    err = capsys.readouterr().err
    assert sum(e.startswith("end") for e in stand_in.events()) == 4
    assert "trial 4/4 completed" in err and "left" in err and "elapsed" in err
    assert {t["status"] for t in stand_in.state().values()} == {"completed"}
    assert cli.main([sweep, "--backend", "local"]) == 0  # nothing left: no process started
    assert len(stand_in.events()) == 8 and "4 done, 0 to run" in capsys.readouterr().err


def test_failed_trials_rerun_only_with_retry_failed(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = stand_in.sweep(lrs=(0.1, 0.5))
    assert cli.main([sweep, "--backend", "local"]) == 1
    assert "ValueError: boom" in capsys.readouterr().err
    statuses = sorted(t["status"] for t in stand_in.state().values())
    assert statuses == ["completed", "completed", "failed", "failed"]
    assert cli.main([sweep, "--backend", "local"]) == 1
    assert len(stand_in.events()) == 8 and "2 failed skipped" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_FIXED", "1")
    assert cli.main([sweep, "--backend", "local", "--retry-failed"]) == 0
    assert len(stand_in.events()) == 8 + 4  # only the two failed trials ran again
    assert {t["status"] for t in stand_in.state().values()} == {"completed"}
    assert {t["attempts"] for t in stand_in.state().values()} == {1, 2}


def test_parallel_runs_write_one_log_per_trial(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    monkeypatch.setenv("FAKE_SLEEP", "2")
    assert cli.main([stand_in.sweep(), "--backend", "local", "--parallel", "2"]) == 0
    assert len(list((tmp_path / "runs" / "fake" / "demo" / ".sweep-logs").glob("*.log"))) == 4
    kinds = [e.split()[0] for e in stand_in.events()]
    assert kinds[:2] == ["start", "start"] and kinds.count("end") == 4  # two at a time: both started before an end


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_sweep_is_forwarded_and_the_sweep_resumes(stand_in, sig, tmp_path):
    env = {**os.environ, "FAKE_MARKER": str(tmp_path / "marker.txt"), "FAKE_SLEEP": "60"}
    sweep = stand_in.sweep()
    cmd = [sys.executable, "-m", "vit_lightning.cli", "sweep", sweep, "--backend", "local"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not stand_in.events() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stand_in.events(), "the first trial never started"
    proc.send_signal(sig)  # only the sweep: the child is in its own session
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert [e.split()[0] for e in stand_in.events()] == ["start", f"signal{int(sig)}"]
    assert [(t["status"], t["error"]) for t in stand_in.state().values()] == [("interrupted", f"stopped by {sig.name}")]
    env["FAKE_SLEEP"] = "0"
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    assert sum(e.startswith("end") for e in stand_in.events()) == 4


def test_a_trial_whose_run_dir_another_process_holds_is_not_started(stand_in, tmp_path, monkeypatch, capsys):
    from vit_lightning.commands.sweep import trials
    from vit_lightning.run import rundir

    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = stand_in.sweep()
    first = trials.build([yaml.safe_load(Path(sweep).read_text())])[0]
    held = rundir.acquire(first.run_dir)  # stands in for the fit child of a sweep that was SIGKILLed
    try:
        assert cli.main([sweep, "--backend", "local"]) == 0  # the held trial is the live holder's to finish
        err = capsys.readouterr().err
        assert f"trial 1/4 skipped: {first.run_dir} is being trained by pid {os.getpid()}" in err
        assert "1 left to another process" in err
        ended = sorted(e.split()[1] for e in stand_in.events() if e.startswith("end"))
        assert first.id not in ended and len(ended) == 3  # the three others ran
    finally:
        rundir.release(held)
    assert cli.main([sweep, "--backend", "local"]) == 0  # once it is free, the trial runs
    assert sum(e.startswith("end") for e in stand_in.events()) == 4


STUBBORN = r"""
import os, pathlib, signal, subprocess, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "120"], start_new_session=True)  # like a W&B agent's run: a group of its own
pathlib.Path(os.environ["PID_FILE"]).write_text(str(child.pid))
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("backend", ["local", "wandb"])
def test_both_backends_stop_alike(backend, tmp_path, monkeypatch):
    """SIGTERM is forwarded; children that ignore it are killed with all below them; the exit code is 128+15."""
    from vit_lightning.commands.sweep import supervise, wandb_backend

    script, pid_file = tmp_path / "stubborn.py", tmp_path / "pid"
    script.write_text(STUBBORN)
    monkeypatch.setenv("PID_FILE", str(pid_file))
    monkeypatch.setattr(supervise, "GRACE_S", 1.0)

    def terminate_once_started():
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_file.exists():  # never signal pytest itself when the sweep did not get that far
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_started, daemon=True).start()
    if backend == "local":
        config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "program": str(script),
                  "command": ["${env}", "${interpreter}", "${program}"],
                  "parameters": {"run.root": {"value": str(tmp_path / "runs")}, "model.lr": {"values": [0.1, 0.2]}}}
        sweep = tmp_path / "stubborn.yaml"
        sweep.write_text(yaml.safe_dump(config))
        code = cli.main([str(sweep), "--backend", "local"])
        saved = json.loads(next((tmp_path / "runs").glob(f"*/*/{local.STATE}")).read_text())["trials"]
        assert [t["status"] for t in saved.values()] == ["interrupted"]  # the second trial never started
    else:
        agents = [wandb_backend.Agent(((sys.executable, str(script)), ("true",)), {})]
        code = wandb_backend.run_agents(agents, stagger_s=0, log=lambda msg: None)
    assert code == 128 + signal.SIGTERM
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild)
