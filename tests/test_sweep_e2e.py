"""End to end: real `vit-ablate fit` trials (tiny: 2 batches, 1 epoch) driven by the local sweep backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vit_lightning.commands.sweep import cli, local, trials

pytestmark = pytest.mark.slow  # every test here trains or starts processes that do

WRAPPER = r'''
import hashlib, json, os, sys
args = sys.argv[1:]
key = hashlib.sha1(json.dumps(sorted(args)).encode()).hexdigest()[:8]
def note(text):
    with open(os.environ["E2E_MARKER"], "a") as f:
        f.write(text + "\n")
note(f"start {key}")
from vit_lightning.cli import main
rc = main(["fit", *args])
note(f"end {key} {rc}")
sys.exit(rc)
'''


def tiny_sweep(tmp_path: Path, grid: dict, command=None, program=None) -> str:
    fixed = {
        "data.name": "mnist5k", "data.batch_size": 16, "model.variant": "micro", "model.patch_size": 7,
        "trainer.max_epochs": 1, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1,
        "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.enable_model_summary": False,
        "run.root": str(tmp_path / "runs"), "run.ablation": "e2e", "run.profile": "demo", "run.wandb": "off",
        "seed_everything": 0,
    }
    params = {k: {"value": v} for k, v in fixed.items()} | {k: {"values": v} for k, v in grid.items()}
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"}, "parameters": params,
              "command": command or ["${env}", "vit-ablate", "fit", "${args}"]}
    if program:
        config["program"] = program
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def records(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "e2e" / "demo").glob("*/results.json"))]


def test_grid_2x2_leaves_four_completed_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = tiny_sweep(tmp_path, {"model.pos_encoding": ["learned_1d", "none"], "model.pooling": ["cls", "gap"]})
    assert cli.main([sweep, "--backend", "local", "--parallel", "2"]) == 0
    recs = records(tmp_path)
    assert len(recs) == 4 and {r["status"] for r in recs} == {"completed"}
    cells = {(r["config"]["model.pos_encoding"], r["config"]["model.pooling"]) for r in recs}
    assert cells == {(e, p) for e in ("learned_1d", "none") for p in ("cls", "gap")}
    assert all(r["metrics"]["val/acc_best"] is not None for r in recs)
    # fit named each run with the id the runner handed it, and wrote it into the record
    ids = {t.id for t in trials.build([yaml.safe_load(Path(sweep).read_text())])}
    assert {r["trial"] for r in recs} == {r["name"] for r in recs} == ids


def test_fit_refuses_a_trial_id_that_is_not_a_plain_name(tmp_path, capsys):
    from vit_lightning.commands.fit import main as train

    code = train.main(["--run.trial=../elsewhere", f"--run.root={tmp_path / 'runs'}", "--trainer.max_epochs=1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "run.trial='../elsewhere' must be" in err
    assert not any(tmp_path.iterdir())


def _running_pid(tmp_path: Path, timeout: float = 30) -> int:
    """The pid of the trial the sweep state says is running."""
    path = tmp_path / "runs" / "e2e" / "demo" / local.STATE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            running = [t for t in json.loads(path.read_text())["trials"].values() if t["status"] == "running"]
        except (OSError, ValueError):
            running = []
        if running and running[0].get("pid"):
            return running[0]["pid"]
        time.sleep(0.1)
    pytest.fail("no running trial in the sweep state")


def test_sigkilled_sweep_reruns_to_finish_every_trial_once(tmp_path):
    marker = tmp_path / "marker.txt"
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    sweep = tiny_sweep(tmp_path, {"model.pos_encoding": ["learned_1d", "none", "sincos_2d"]},
                       command=["${env}", "${interpreter}", "${program}", "${args}"], program=str(wrapper))
    env = {**os.environ, "E2E_MARKER": str(marker), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "vit_lightning.cli", "sweep", sweep, "--backend", "local"]
    lines = lambda: marker.read_text().splitlines() if marker.exists() else []  # noqa: E731
    sweep_proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while sum(x.startswith("start") for x in lines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sum(x.startswith("start") for x in lines()) == 2, lines()
    # the machine dies mid-trial 2: the sweep and its running fit are killed without warning
    sweep_proc.send_signal(signal.SIGKILL)
    sweep_proc.wait()
    os.killpg(_running_pid(tmp_path), signal.SIGKILL)
    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "1 done, 2 to run" in rerun.stderr
    recs = records(tmp_path)
    assert len(recs) == 3 and {r["status"] for r in recs} == {"completed"}
    starts = [x.split()[1] for x in lines() if x.startswith("start")]
    ends = [x.split()[1:] for x in lines() if x.startswith("end")]
    assert len(starts) == 4 and len(set(starts)) == 3  # the killed trial started twice, the others once
    # each trial trained to the end exactly once
    assert sorted(k for k, _ in ends) == sorted(set(starts)) and {rc for _, rc in ends} == {"0"}
