"""Local backend with a stand-in for `vit-ablate fit` (no torch): resume, failures, retries, signals, slots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from vit_lightning.sweep import cli, local

FAKE_FIT = r'''
import hashlib, json, os, pathlib, signal, sys, time
import yaml
cfg = {k: yaml.safe_load(v) for k, v in (a[2:].split("=", 1) for a in sys.argv[1:])}
name = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:8]
run = pathlib.Path(cfg["run.root"]) / cfg["run.ablation"] / cfg["run.profile"] / name
run.mkdir(parents=True, exist_ok=True)
marker = pathlib.Path(os.environ["FAKE_MARKER"])
note = lambda text: marker.open("a").write(f"{text} {name}\n")
note("start")
record = run / "results.json"
if record.exists() and json.loads(record.read_text())["status"] == "completed":
    sys.exit(0)
def stop(signum, frame):
    note(f"signal{signum}")
    sys.exit(128 + signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
failed = cfg.get("model.lr") == 0.5 and not os.environ.get("FAKE_FIXED")
record.write_text(json.dumps({"status": "failed" if failed else "completed", "config": cfg,
                              "error": "ValueError: boom" if failed else None, "started_at": "t"}))
note("end")
sys.exit(1 if failed else 0)
'''


def make_sweep(tmp_path: Path, lrs=(0.1, 0.2)) -> str:
    fake = tmp_path / "fake_fit.py"
    fake.write_text(FAKE_FIT)
    config = {
        "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "program": str(fake),
        "command": ["${env}", "${interpreter}", "${program}", "${args}"],
        "parameters": {"model.lr": {"values": list(lrs)}, "model.pooling": {"values": ["cls", "gap"]},
                       "run.root": {"value": str(tmp_path / "runs")}, "run.ablation": {"value": "fake"},
                       "run.profile": {"value": "demo"}, "seed_everything": {"value": 0}},
    }
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def events(tmp_path: Path) -> list[str]:
    marker = tmp_path / "marker.txt"
    return marker.read_text().split("\n")[:-1] if marker.exists() else []


def state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "runs" / "fake" / "demo" / local.STATE).read_text())["trials"]


def test_runs_every_trial_then_skips_done_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = make_sweep(tmp_path)
    assert cli.main([sweep, "--backend", "local"]) == 0
    err = capsys.readouterr().err
    assert sum(e.startswith("end") for e in events(tmp_path)) == 4
    assert "trial 4/4 completed" in err and "left" in err and "elapsed" in err
    assert {t["status"] for t in state(tmp_path).values()} == {"completed"}
    assert cli.main([sweep, "--backend", "local"]) == 0  # nothing left: no process started
    assert len(events(tmp_path)) == 8 and "4 done, 0 to run" in capsys.readouterr().err


def test_failed_trials_rerun_only_with_retry_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = make_sweep(tmp_path, lrs=(0.1, 0.5))
    assert cli.main([sweep, "--backend", "local"]) == 1
    assert "ValueError: boom" in capsys.readouterr().err
    statuses = sorted(t["status"] for t in state(tmp_path).values())
    assert statuses == ["completed", "completed", "failed", "failed"]
    assert cli.main([sweep, "--backend", "local"]) == 1
    assert len(events(tmp_path)) == 8 and "2 failed skipped" in capsys.readouterr().err
    monkeypatch.setenv("FAKE_FIXED", "1")
    assert cli.main([sweep, "--backend", "local", "--retry-failed"]) == 0
    assert len(events(tmp_path)) == 8 + 4  # only the two failed trials ran again
    assert {t["status"] for t in state(tmp_path).values()} == {"completed"}
    assert {t["attempts"] for t in state(tmp_path).values()} == {1, 2}


def test_parallel_runs_write_one_log_per_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    monkeypatch.setenv("FAKE_SLEEP", "1")
    assert cli.main([make_sweep(tmp_path), "--backend", "local", "--parallel", "2"]) == 0
    assert len(list((tmp_path / "runs" / "fake" / "demo" / ".sweep-logs").glob("*.log"))) == 4


def test_slots_split_gpus_or_cpu_threads():
    assert local.slots(1, []) == [{}]
    assert local.slots(2, [], cpus=8) == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}] * 2
    assert local.slots(2, ["0", "1", "2", "3"]) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]


def test_sigint_is_forwarded_and_the_sweep_resumes(tmp_path):
    env = {**os.environ, "FAKE_MARKER": str(tmp_path / "marker.txt"), "FAKE_SLEEP": "60"}
    sweep = make_sweep(tmp_path)
    cmd = [sys.executable, "-m", "vit_lightning.cli", "sweep", sweep, "--backend", "local"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not events(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert events(tmp_path), "the first trial never started"
    proc.send_signal(signal.SIGINT)  # only the sweep: the child is in its own session
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert [e.split()[0] for e in events(tmp_path)] == ["start", f"signal{int(signal.SIGINT)}"]
    assert [t["status"] for t in state(tmp_path).values()] == ["interrupted"]
    env["FAKE_SLEEP"] = "0"
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    assert sum(e.startswith("end") for e in events(tmp_path)) == 4


def test_a_trial_still_running_elsewhere_is_not_started_twice(tmp_path, monkeypatch, capsys):
    import socket

    from vit_lightning.sweep import trials

    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    sweep = make_sweep(tmp_path)
    config = yaml.safe_load(Path(sweep).read_text())
    first = trials.build([config])[0]
    orphan = subprocess.Popen(["sleep", "30"])  # stands in for the fit child of a sweep that was SIGKILLed
    try:
        local.State().update(first, status="running", pid=orphan.pid, host=socket.gethostname())
        assert cli.main([sweep, "--backend", "local"]) == 1
        assert f"still runs as pid {orphan.pid}" in capsys.readouterr().err
        assert sum(e.startswith("end") for e in events(tmp_path)) == 3
    finally:
        orphan.kill()
        orphan.wait()
    assert cli.main([sweep, "--backend", "local"]) == 0  # once it is gone, the trial runs
    assert sum(e.startswith("end") for e in events(tmp_path)) == 4
