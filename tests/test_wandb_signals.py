"""SLURM signals every process of a job, wandb's service process (wandb-core) too: the trial still stops cleanly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tiny import TINY_MODEL  # noqa: E402  (tests/tiny.py)

VIT = str(Path(sys.executable).with_name("vit-ablate"))
TINY = [*TINY_MODEL, "--data.batch_size=8", "--trainer.limit_train_batches=60", "--trainer.limit_val_batches=2",
        "--run.fewshot_shots=[]", "--trainer.max_epochs=4", "--run.wandb=offline", "--trainer.log_every_n_steps=1"]


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for child in map(int, out) for d in (child, *descendants(child))]


def test_sigterm_to_the_trial_and_wandb_core_exits_143_with_the_record_and_no_traceback(tmp_path):
    # its own wandb-core: not a service this test process may have started (WANDB_SERVICE)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}
    log = (tmp_path / "trial.log").open("w")
    proc = subprocess.Popen([VIT, "fit", *TINY, f"--run.root={tmp_path / 'runs'}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            records = list((tmp_path / "runs").glob("*/*/*/results.json"))
            if records and json.loads(records[0].read_text() or "{}").get("history"):
                break
            time.sleep(0.1)
        core = [pid for pid in descendants(proc.pid) if "wandb-core" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert core, "no wandb-core under the trial"
        for pid in core:  # SLURM's order among a job's processes is arbitrary; the service first is the hard case
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30  # the service has exited (not just been signalled) before the trial is
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() and
                                                  "wandb-core" in _cmdline(pid) for pid in core):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "trial.log").read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert text.count("W&B's service process is gone") == 1
    [record] = (tmp_path / "runs").glob("*/*/*/results.json")
    assert json.loads(record.read_text())["status"] == "interrupted"


def test_a_local_resume_continues_the_w_and_b_run_in_its_own_project_and_entity(tmp_path, monkeypatch):
    """An agent's trial resumed outside the agent goes on in the run it recorded: id, project and entity."""
    from vit_lightning import loggers
    from vit_lightning.record import write_record

    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    write_record(tmp_path, {"status": "interrupted",
                            "wandb": {"run_id": "r123", "project": "sweep-proj", "entity": "team", "sweep_id": "s"}})
    config = {"run.wandb": "offline", "run.retrain": False, "run.wandb_project": None, "run.ablation": "a",
              "run.profile": "demo"}
    init = loggers.logger(tmp_path, config)._wandb_init
    assert (init["id"], init["project"], init["entity"]) == ("r123", "sweep-proj", "team")
    write_record(tmp_path, {"status": "completed", "wandb": {"run_id": "r123", "project": "sweep-proj"}})
    init = loggers.logger(tmp_path, config)._wandb_init
    assert not init.get("id") and init["project"] == "vit-lightning" and not init.get("entity")  # a new run


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""
