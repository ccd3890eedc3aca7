"""The cluster path on a real one-node SLURM scheduler (tests/slurm_cluster.py): jobs submitted with sbatch,
their ranks signalled as SLURM signals them, their outcome read back from scontrol and the job completion log."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import Cluster, unavailable
from tiny import TINY_MODEL, steps_logged, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]  # one cluster: every slurm test on one worker

VIT = str(Path(sys.executable).with_name("vit-ablate"))
TINY = [*TINY_MODEL, "--data.batch_size=8", "--trainer.limit_val_batches=2", "--run.fewshot_shots=[]",
        "--trainer.log_every_n_steps=1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if reason := unavailable():
        pytest.skip(reason)
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception as error:  # noqa: BLE001 - any failure to start is a reason to skip, given in full
        cluster.stop()
        pytest.skip(f"a one-node SLURM cluster did not start here: {error}")
    yield cluster
    cluster.stop()


def job_script(path: Path, options: list[str], body: str) -> Path:
    path.write_text("\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in options), body, ""]))
    return path


def only_run_dir(root: Path) -> Path:
    [record] = root.glob("*/*/*/results.json")
    return record.parent


def task_pids(job_id: str) -> dict[int, int]:
    """{SLURM_PROCID: pid} of the job's `fit` tasks, found by their environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            env = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
            cmd = (proc / "cmdline").read_text()
        except (OSError, ValueError):
            continue
        if env.get("SLURM_JOB_ID") == job_id and "SLURM_STEP_ID" in env and "fit" in cmd and "python" in cmd:
            found[int(env["SLURM_PROCID"])] = int(proc.name)
    return found


def test_requeue_signal_a_second_apart_checkpoints_requeues_and_resumes_mid_epoch(cluster, tmp_path):
    """The README's multi-node recipe on 2 tasks: SIGUSR1 reaching the ranks 1 s apart requeues the job,
    which resumes from the mid-epoch checkpoint and trains every epoch (and step) exactly once."""
    root = tmp_path / "runs"
    epochs, batches = 3, 40
    fit = [VIT, "fit", *TINY, f"--run.root={root}", f"--trainer.max_epochs={epochs}",
           f"--trainer.limit_train_batches={batches}", "--trainer.devices=2", "--trainer.num_nodes=1",
           "--trainer.strategy=ddp"]
    script = job_script(tmp_path / "trial.sh", [
        "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--signal=SIGUSR1@90", "--requeue",
        "--time=10", "--open-mode=append", "--output=job.log"], "srun " + " ".join(fit))
    job = cluster.sbatch(script)
    # stop in the middle of epoch 2: after its first steps, well before its last
    run_dir = wait_for(lambda: next(iter(root.glob("*/*/*/results.json")), None), 120, "no record").parent
    wait_for(lambda: max(steps_logged(run_dir), default=0) >= batches + 5, 180, "epoch 2 never started")
    pids = wait_for(lambda: (p := task_pids(job)) and len(p) == 2 and p, 10, "no two tasks")
    os.kill(pids[1], signal.SIGUSR1)  # SLURM does not signal the ranks at one instant
    time.sleep(1.0)
    os.kill(pids[0], signal.SIGUSR1)
    stopped = wait_for(lambda: (r := json.loads((run_dir / "results.json").read_text() or "{}")).get("status")
                       == "interrupted" and r, 60, "never recorded interrupted")
    assert stopped["error"] == "stopped by SIGUSR1"  # the signal that stopped it, not SIGTERM
    final = cluster.wait(job, 200, until=lambda j: j.get("JobState") == "COMPLETED" or
                         (j.get("JobState") in {"FAILED", "TIMEOUT", "CANCELLED"}))
    log = (tmp_path / "job.log").read_text()
    assert final["JobState"] == "COMPLETED", log[-3000:]
    assert int(final["Restarts"]) == 1, final
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == list(range(epochs))
    steps = steps_logged(run_dir)
    assert steps == sorted(set(steps)) and len(steps) == epochs * batches  # every step once, none twice
    assert "resuming from" in log and "hpc_ckpt" in log and "Traceback" not in log
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))  # the requeue checkpoint is gone once the run completed
    # seconds since boot counted as training gave 3.2; a busy 2-core machine trains this fit at 45 images/s and up
    assert record["compute"]["train_images_per_s"] > 10


def test_scancel_stops_both_ranks_with_a_checkpoint_and_the_same_sbatch_resumes(cluster, tmp_path):
    """scancel signals every process of the job: the trial stops at one step, says interrupted, and the same
    job script submitted again finishes it without training a step twice."""
    root = tmp_path / "runs"
    epochs, batches = 2, 40
    fit = [VIT, "fit", *TINY, f"--run.root={root}", f"--trainer.max_epochs={epochs}",
           f"--trainer.limit_train_batches={batches}", "--trainer.devices=2", "--trainer.strategy=ddp"]
    script = job_script(tmp_path / "trial.sh", ["--ntasks-per-node=2", "--cpus-per-task=1", "--time=10",
                                                "--open-mode=append", "--output=job.log"], "srun " + " ".join(fit))
    job = cluster.sbatch(script)
    run_dir = wait_for(lambda: next(iter(root.glob("*/*/*/results.json")), None), 120, "no record").parent
    wait_for(lambda: max(steps_logged(run_dir), default=0) >= 10, 120, "training never started")
    cluster.run("scancel", job)
    final = cluster.wait(job, 60)
    assert final["JobState"] == "CANCELLED"
    stopped = json.loads((run_dir / "results.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["error"] == "stopped by SIGTERM"
    assert list(run_dir.glob("hpc_ckpt_*.ckpt"))
    again = cluster.sbatch(script)
    assert cluster.wait(again, 120)["JobState"] == "COMPLETED", (tmp_path / "job.log").read_text()[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == list(range(epochs))
    steps = steps_logged(run_dir)
    assert steps == sorted(set(steps)) and len(steps) == epochs * batches
    assert "Traceback" not in (tmp_path / "job.log").read_text()


def test_a_two_task_job_array_of_a_local_sweep_trains_every_trial_once_and_both_tasks_succeed(
        cluster, tmp_path, monkeypatch, capsys):
    """The cluster path without W&B: the job script `vit-ablate sweep FILE --backend local --print-sbatch` prints,
    submitted as a 2-task job array on one run root; the tasks split the trials through the run dirs' locks,
    and an `afterok` job after the array runs."""
    import yaml

    from vit_lightning.commands.sweep import cli

    root = tmp_path / "runs"
    fixed = {"model.width": 32, "model.depth": 1, "model.heads": 2, "model.mlp_dim": 64, "data.batch_size": 8,
             "trainer.limit_train_batches": 5, "trainer.limit_val_batches": 2, "trainer.num_sanity_val_steps": 0,
             "trainer.max_epochs": 1, "trainer.accelerator": "cpu", "run.fewshot_shots": [],
             "run.root": str(root), "run.ablation": "array", "run.profile": "demo", "seed_everything": 0}
    sweep = {"program": "vit-ablate", "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
             "command": ["${env}", "vit-ablate", "fit", "${args}"],
             "parameters": {**{k: {"value": v} for k, v in fixed.items()},
                            "model.lr": {"values": [0.001, 0.002, 0.003, 0.004]}}}
    (tmp_path / "array.yaml").write_text(yaml.safe_dump(sweep))
    monkeypatch.chdir(tmp_path)  # the script runs the sweep where it was printed
    capsys.readouterr()
    assert cli.main([str(tmp_path / "array.yaml"), "--backend", "local", "--print-sbatch"]) == 0
    text = capsys.readouterr().out
    assert "--backend local --parallel 1" in text and "#SBATCH --cpus-per-task=1 " in text and "gpus" not in text
    (tmp_path / "array.sh").write_text(text)
    # the options a user adds at submission: how many tasks, and this small cluster's limits
    array = cluster.sbatch(tmp_path / "array.sh", "--array=1-2", "--time=10", "--mem=500", "--output=array-%a.log")
    after = cluster.sbatch(job_script(tmp_path / "after.sh", ["--ntasks=1", "--time=1", "--output=after.log"],
                                      "echo tables"), f"--dependency=afterok:{array}")
    done = cluster.wait(after, 300, until=lambda j: j.get("JobState") in {"COMPLETED", "CANCELLED", "FAILED"} or
                        j.get("Reason") == "DependencyNeverSatisfied")
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("array-*.log")))
    assert done.get("JobState") == "COMPLETED", logs[-3000:]  # afterok: both array tasks exited 0
    records = [json.loads(p.read_text()) for p in root.glob("array/demo/*/results.json")]
    assert sorted(r["config"]["model.lr"] for r in records) == [0.001, 0.002, 0.003, 0.004]
    assert all(r["status"] == "completed" and len(r["history"]) == 1 for r in records)
    assert logs.count("vit-ablate fit: run dir ") == 4  # each trial trained by one task, once


@pytest.mark.parametrize("layout", [["-n2"], ["--ntasks-per-node=2"]])
def test_srun_tasks_that_do_not_match_the_devices_are_one_line_before_anything_trains(cluster, tmp_path, layout):
    """`srun -n2 fit` and `--ntasks-per-node=2` with the default trainer.devices=1: one line, no run dir."""
    done = cluster.run("srun", *layout, "--time=2", VIT, "fit", *TINY, f"--run.root={tmp_path / 'runs'}",
                       check=False, timeout=150, cwd=str(tmp_path))
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("vit-ablate fit: error: SLURM started 2")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "runs").exists()  # nothing written, and never two writers of one run dir


def printed_script(tmp_path: Path, monkeypatch, capsys, epochs: int, batches: int, lrs: list[float], **more) -> Path:
    """The job script `vit-ablate sweep FILE --backend local --print-sbatch` prints for a tiny sweep over lrs,
    every training step in each trial's metrics.csv."""
    import yaml

    from vit_lightning.commands.sweep import cli

    fixed = {"model.width": 32, "model.depth": 1, "model.heads": 2, "model.mlp_dim": 64, "data.batch_size": 8,
             "trainer.limit_train_batches": batches, "trainer.limit_val_batches": 1, "trainer.num_sanity_val_steps": 0,
             "trainer.max_epochs": epochs, "trainer.accelerator": "cpu", "trainer.log_every_n_steps": 1,
             "run.fewshot_shots": [], "run.root": str(tmp_path / "runs"), "run.ablation": "job", "run.profile": "demo",
             "seed_everything": 0, **more}
    sweep = {"program": "vit-ablate", "method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
             "command": ["${env}", "vit-ablate", "fit", "${args}"],
             "parameters": {**{k: {"value": v} for k, v in fixed.items()}, "model.lr": {"values": lrs}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(sweep))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli.main([str(tmp_path / "job.yaml"), "--backend", "local", "--print-sbatch"]) == 0
    (tmp_path / "job.sh").write_text(capsys.readouterr().out)
    return tmp_path / "job.sh"


def every_step_once(root: Path, trials: int, epochs: int, batches: int) -> None:
    records = sorted(root.glob("job/demo/*/results.json"))
    assert len(records) == trials
    for path in records:
        record = json.loads(path.read_text())
        assert record["status"] == "completed" and [h["epoch"] for h in record["history"]] == list(range(epochs))
        steps = steps_logged(path.parent)
        assert steps == sorted(set(steps)) and len(steps) == epochs * batches, (path.parent.name, steps)


def test_scancel_of_a_printed_array_stays_cancelled_and_its_resubmission_trains_every_step_once(
        cluster, tmp_path, monkeypatch, capsys):
    """scancel signals every process of each task (the script, the sweep, its worker, the trial): the trials stop
    with their stop checkpoint, the sweep says interrupted, and the job is not requeued by its script; the same
    script submitted again finishes every trial without training a step twice."""
    root, epochs, batches = tmp_path / "runs", 2, 40
    script = printed_script(tmp_path, monkeypatch, capsys, epochs, batches, [0.001, 0.002])
    array = cluster.sbatch(script, "--array=1-2", "--time=10", "--mem=500", "--output=array-%a.log")
    wait_for(lambda: any(len(steps_logged(p.parent)) >= 5 for p in root.glob("job/demo/*/results.json")), 180,
             "no trial trained")
    cluster.run("scancel", array)
    tasks = [f"{array}_1", f"{array}_2"]
    for task in tasks:
        assert cluster.wait(task, 120)["JobState"] == "CANCELLED"
    time.sleep(20)  # a requeue would show by now: the old script's came back PENDING 7 s after the scancel
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("array-*.log")))
    for task in tasks:
        job = cluster.job(task)
        assert job["JobState"] == "CANCELLED" and int(job["Restarts"]) == 0, (job, logs[-3000:])
    assert "Traceback" not in logs and "scontrol requeue" not in logs, logs[-3000:]
    states = json.loads((root / "job" / "demo" / ".sweep-state.json").read_text())["trials"]
    assert "interrupted" in {s["status"] for s in states.values()} and "running" not in {s["status"] for s in states.values()}
    again = cluster.sbatch(script, "--array=1-2", "--time=10", "--mem=500", "--output=again-%a.log")
    for task in (f"{again}_1", f"{again}_2"):
        assert cluster.wait(task, 400)["JobState"] == "COMPLETED", \
            "\n".join(p.read_text() for p in sorted(tmp_path.glob("again-*.log")))[-3000:]
    every_step_once(root, 2, epochs, batches)


SLOW_FIRST_ATTEMPT = '''
import os, time
from lightning.pytorch import Callback

class SlowFirstAttempt(Callback):
    """A second per step until SLURM has requeued the job: the time limit always comes mid-training."""

    def on_train_batch_end(self, *args):
        if not int(os.environ.get("SLURM_RESTART_COUNT") or 0):
            time.sleep(1.0)
'''


@pytest.mark.timeout(900)  # a 4-minute time limit, then the requeued job: about 3 minutes on 2 idle cores
def test_a_printed_script_at_its_time_limit_requeues_itself_and_completes(cluster, tmp_path, monkeypatch, capsys):
    """The printed script as submitted with a short time limit (the one line a user edits): SIGUSR1 to the script
    120 s before the limit stops the sweep with a checkpoint, the job requeues itself, and the requeued job
    completes the sweep; every step trained once."""
    root, epochs, batches = tmp_path / "runs", 3, 100
    (tmp_path / "slowfirst.py").write_text(SLOW_FIRST_ATTEMPT)
    monkeypatch.syspath_prepend(str(tmp_path))  # the sweep checks every trial's options as it prints the script
    script = printed_script(tmp_path, monkeypatch, capsys, epochs, batches, [0.001],
                            **{"trainer.callbacks": "slowfirst.SlowFirstAttempt"})
    env = cluster.env(PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    job = cluster.sbatch(script, "--time=4", "--mem=500", "--output=limit.log", env=env)  # SIGUSR1 after 1-2 min
    final = cluster.wait(job, 600, until=lambda j: j.get("JobState") in {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"})
    log = (tmp_path / "limit.log").read_text()
    assert final["JobState"] == "COMPLETED" and int(final["Restarts"]) == 1, (final, log[-3000:])
    assert "the job's time limit (SIGUSR1): stopping 1 process(es)" in log and "Traceback" not in log, log[-3000:]
    every_step_once(root, 1, epochs, batches)
