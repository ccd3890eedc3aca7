"""A local sweep of real `vit-ablate fit` trials under the signals a cluster sends: a job-wide SIGTERM (every
process at once), the sweep killed outright, a trial worker killed; nothing trained twice, nothing left running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny import steps_logged, wait_for

from vit_lightning.commands.sweep import local
from vit_lightning.commands.sweep.supervise import descendants

pytestmark = pytest.mark.slow

IGNORE_TERM = '''
import signal
from lightning.pytorch import Callback

class IgnoreTerm(Callback):
    """A trial that ignores SIGTERM once it trains (after fit's own handler is in place)."""

    def on_train_batch_end(self, *args):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
'''


def sweep_file(tmp_path: Path, epochs: int, batches: int, lrs=(0.001, 0.002), **more) -> Path:
    """A grid sweep of the tiny model over lrs, one run root under tmp_path, every step in metrics.csv."""
    fixed = {"model.width": 32, "model.depth": 1, "model.heads": 2, "model.mlp_dim": 64, "data.batch_size": 8,
             "trainer.limit_train_batches": batches, "trainer.limit_val_batches": 1,
             "trainer.num_sanity_val_steps": 0, "trainer.max_epochs": epochs, "trainer.accelerator": "cpu",
             "trainer.log_every_n_steps": 1, "trainer.enable_model_summary": False, "run.fewshot_shots": [],
             "run.root": str(tmp_path / "runs"), "run.ablation": "sig", "run.profile": "demo", "seed_everything": 0,
             **more}
    sweep = {"program": "vit-ablate", "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
             "command": ["${env}", "vit-ablate", "fit", "${args}"],
             "parameters": {**{k: {"value": v} for k, v in fixed.items()}, "model.lr": {"values": list(lrs)}}}
    path = tmp_path / "sig.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def start_sweep(path: Path, log: Path, **env: str) -> subprocess.Popen:
    """`vit-ablate sweep PATH --backend local` in its own process group (as a job's batch script runs it)."""
    cmd = [sys.executable, "-m", "vit_lightning.cli", "sweep", str(path), "--backend", "local"]
    return subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def run_dirs(tmp_path: Path) -> list[Path]:
    return sorted(p.parent for p in (tmp_path / "runs").glob("sig/demo/*/results.json"))


def state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "runs" / "sig" / "demo" / local.STATE).read_text())["trials"]


def training(tmp_path: Path, steps: int = 3) -> Path | None:
    """The run dir of a trial that has logged at least `steps` training steps, once there is one."""
    return next((d for d in run_dirs(tmp_path) if len(steps_logged(d)) >= steps), None)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_every_step_once(tmp_path: Path, trials: int, epochs: int, batches: int) -> None:
    dirs = run_dirs(tmp_path)
    assert len(dirs) == trials
    for run_dir in dirs:
        record = json.loads((run_dir / "results.json").read_text())
        assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == list(range(epochs))
        steps = steps_logged(run_dir)
        assert steps == sorted(set(steps)) and len(steps) == epochs * batches, (run_dir.name, steps)


def test_a_job_wide_sigterm_stops_the_sweep_once_and_the_rerun_trains_every_step_once(tmp_path):
    """SIGTERM to every process of the sweep at once (its group, its workers, its trial), as scancel sends it:
    the trial writes its stop checkpoint, the sweep exits 143 saying interrupted, and a re-run finishes."""
    epochs, batches = 2, 30
    path, log = sweep_file(tmp_path, epochs, batches), tmp_path / "sweep.log"
    sweep = start_sweep(path, log)
    try:
        wait_for(lambda: training(tmp_path), 180, "no trial trained")
        everyone = [sweep.pid, *descendants(sweep.pid)]
        assert len(everyone) >= 3  # the sweep, its trial worker, the trial
        os.killpg(sweep.pid, signal.SIGTERM)  # kill -TERM -- -PGID
        for pid in everyone[1:]:  # and every other process of the job, at the same moment
            os.kill(pid, signal.SIGTERM)
        assert sweep.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    text = log.read_text()
    # one stop, never a kill; the trial got the job-wide SIGTERM itself, so it may be gone before the sweep acts on
    # its own copy and the line then counts 0 processes to stop
    stops = re.findall(r"SIGTERM: stopping [01] process\(es\); again to kill", text)
    assert "Traceback" not in text and len(stops) == 1 and "killing" not in text, text[-3000:]
    assert not any(alive(pid) for pid in everyone)
    states = state(tmp_path)
    assert [s["status"] for s in states.values()] == ["interrupted"] and all(s["pid"] is None for s in states.values())
    [stopped] = run_dirs(tmp_path)
    assert json.loads((stopped / "results.json").read_text())["status"] == "interrupted"
    assert list(stopped.glob("hpc_ckpt_*.ckpt"))  # the stop checkpoint: the re-run resumes at that step
    again = start_sweep(path, log)
    assert again.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert_every_step_once(tmp_path, 2, epochs, batches)


def test_a_trial_whose_sweep_is_killed_stops_itself_with_a_checkpoint(tmp_path):
    """SIGKILL of the sweep (out of memory, `kill -9`): its trial does not train on as an orphan; it stops as the
    sweep would have stopped it, with its stop checkpoint and an interrupted record, and the worker leaves too."""
    path, log = sweep_file(tmp_path, 50, 30, lrs=(0.001,)), tmp_path / "sweep.log"
    sweep = start_sweep(path, log)
    try:
        run_dir = wait_for(lambda: training(tmp_path), 180, "no trial trained")
        below = descendants(sweep.pid)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        wait_for(lambda: not any(alive(pid) for pid in below), 60, "the trial outlived its sweep")
    finally:
        for pid in descendants(sweep.pid) + [p for p in locals().get("below", []) if alive(p)]:
            os.kill(pid, signal.SIGKILL)
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "interrupted" and record["error"] == "stopped by SIGTERM"
    assert list(run_dir.glob("hpc_ckpt_*.ckpt"))
    assert "its sweep (pid" in log.read_text()


def test_a_dead_worker_is_one_line_its_trial_is_stopped_and_the_sweep_goes_on(tmp_path):
    """SIGKILL of the trial worker while its trial (which ignores SIGTERM) trains: one line, the trial stopped
    (SIGKILL after the grace period) and recorded failed, a new worker for the next trial, the usual exit code."""
    (tmp_path / "ignoreterm.py").write_text(IGNORE_TERM)
    path = sweep_file(tmp_path, 1, 30, lrs=(0.001,), **{"trainer.callbacks": "ignoreterm.IgnoreTerm"})
    spec = yaml.safe_load(path.read_text())
    spec["parameters"]["trainer.max_epochs"] = {"values": [50, 1]}  # trial 1 trains long, trial 2 one epoch
    path.write_text(yaml.safe_dump(spec))
    log = tmp_path / "sweep.log"
    sweep = start_sweep(path, log, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
                        VIT_ABLATE_STOP_GRACE_S="3")
    try:
        wait_for(lambda: training(tmp_path), 180, "no trial trained")
        [worker] = [p for p in descendants(sweep.pid) if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]
                    == str(sweep.pid)]
        [trial] = [s["pid"] for s in state(tmp_path).values() if s["status"] == "running"]
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: not alive(trial), 60, "the trial that ignores SIGTERM was never killed")
        code = sweep.wait(timeout=300)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
        for pid in descendants(sweep.pid):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 1, text[-3000:]  # one trial failed: the sweep's usual code for that
    assert "[sweep] trial 1/2: its worker died (signal 9)" in text and "Traceback" not in text, text[-3000:]
    states = state(tmp_path)
    died = [s for s in states.values() if s["error"] == "its worker died (signal 9)"]
    assert [s["status"] for s in died] == ["failed"] and all(s["pid"] is None for s in states.values())
    assert sorted(s["status"] for s in states.values()) == ["completed", "failed"]


@pytest.mark.parametrize("order", [(signal.SIGTERM, signal.SIGUSR1), (signal.SIGUSR1, signal.SIGTERM)],
                         ids=["term-then-usr1", "usr1-then-term"])
def test_sigterm_and_the_time_limits_sigusr1_in_either_order_are_one_stop_with_a_checkpoint(tmp_path, order):
    """A cancel or pre-emption in the job's last minutes: SIGTERM and the time limit's SIGUSR1 a moment apart, in
    either order. The trial stops once with its stop checkpoint (never killed), and the re-run trains every step
    once."""
    epochs, batches = 2, 30
    path, log = sweep_file(tmp_path, epochs, batches, lrs=(0.001,)), tmp_path / "sweep.log"
    sweep = start_sweep(path, log)
    try:
        wait_for(lambda: training(tmp_path), 180, "no trial trained")
        for signum in order:
            os.kill(sweep.pid, signum)
            time.sleep(0.3)
        assert sweep.wait(timeout=120) == 128 + order[0], log.read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    text = log.read_text()
    assert "killing" not in text and "Traceback" not in text and text.count("stopping 1 process(es)") == 1, text
    [stopped] = run_dirs(tmp_path)
    assert json.loads((stopped / "results.json").read_text())["status"] == "interrupted"
    assert list(stopped.glob("hpc_ckpt_*.ckpt"))  # the stop checkpoint: the re-run resumes at that step
    assert start_sweep(path, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert_every_step_once(tmp_path, 1, epochs, batches)
