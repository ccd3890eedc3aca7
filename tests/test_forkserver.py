"""The local backend's trial worker: a trial forked from it is the `vit-ablate fit` a fresh process would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from vit_lightning.commands.sweep import forkserver
from vit_lightning.commands.sweep.trials import executable
from vit_lightning.run import rundir


def fit_argv(root, *more: str) -> list[str]:
    return executable(("vit-ablate", "fit", f"--run.root={root}", "--run.fewshot_shots=[]", *more))


def record_of(root) -> dict:
    [path] = root.glob("*/*/*/results.json")
    return json.loads(path.read_text())


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture
def worker():
    """A trial worker; at teardown every trial it started that still runs is killed (a failed test leaves none)."""
    w = forkserver.Worker(dict(os.environ))
    started, start = [], w.start
    w.start = lambda *a, **k: started.append(start(*a, **k)) or started[-1]
    yield w
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    w.close()


@pytest.mark.slow
def test_a_forked_trial_trains_what_a_fresh_process_trains_under_the_sweeps_lock(worker, tmp_path, tiny_fit):
    args = (*tiny_fit(3, 2), "--trainer.max_epochs=2", "--run.trial=t")
    fresh = subprocess.run(fit_argv(tmp_path / "fresh", *args), capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-2000:]

    forked_root = tmp_path / "forked"
    run_dir = forked_root / "adhoc" / "local" / "t"
    lock = rundir.acquire(run_dir)  # held here, as the sweep holds it: the trial must use this very descriptor
    log = tmp_path / "trial.log"
    with open(log, "wb") as out:
        proc = worker.start(fit_argv(forked_root, *args), {**os.environ, rundir.ENV_FD: str(lock)},
                            stdout=out, pass_fds=(lock,))
        assert proc.wait() == 0, log.read_text()[-2000:]
    rundir.release(lock)
    assert "epoch 2/2" in log.read_text()  # the trial's output went to its log
    a, b = record_of(tmp_path / "fresh"), record_of(forked_root)
    assert a["status"] == b["status"] == "completed"
    assert a["metrics"] == b["metrics"]  # bit for bit: same seed, same machine, same threads
    assert {k: v for k, v in a["config"].items() if k != "run.root"} == \
        {k: v for k, v in b["config"].items() if k != "run.root"}


@pytest.mark.slow
def test_a_forked_trial_leads_its_own_session_and_stops_on_sigterm_as_fit_does(worker, tmp_path, tiny_fit):
    root = tmp_path / "runs"
    proc = worker.start(fit_argv(root, *tiny_fit(20, 1), "--trainer.max_epochs=500"), dict(os.environ),
                        stdout=open(tmp_path / "log", "wb"))
    assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid  # the supervisor signals its process group
    # an epoch recorded: fit is training, with its stop handlers in place (a SIGTERM before them kills it outright)
    wait_for(lambda: any(json.loads(p.read_text() or "{}").get("history") for p in root.glob("*/*/*/results.json")))
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait() == 128 + signal.SIGTERM
    assert record_of(root)["status"] == "interrupted"


@pytest.mark.slow
def test_a_killed_trial_reports_the_signal_and_a_bad_command_its_exit_code(worker, tmp_path, tiny_fit):
    proc = worker.start(fit_argv(tmp_path, *tiny_fit(400, 1), "--trainer.max_epochs=50"), dict(os.environ),
                        stdout=open(tmp_path / "log", "wb"))
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # as subprocess.Popen.returncode says it
    proc = worker.start(executable(("vit-ablate", "fit", "--model.pooling=nope")), dict(os.environ),
                        stdout=open(tmp_path / "log2", "wb"))
    assert proc.wait() == 2
    assert "nope" in (tmp_path / "log2").read_text()
    with pytest.raises(ValueError, match="vit-ablate commands only"):
        worker.start(["/bin/true"], dict(os.environ))
    with pytest.raises(ValueError, match="runs `vit-ablate fit` and `eval` only, not table"):
        worker.start(executable(("vit-ablate", "table", "pos_encoding")), dict(os.environ))


@pytest.mark.slow
@pytest.mark.ddp
def test_a_forked_ddp_trial_starts_its_other_rank_with_the_trials_own_command(worker, tmp_path, tiny_fit):
    root = tmp_path / "runs"
    log = tmp_path / "log"
    proc = worker.start(fit_argv(root, *tiny_fit(2, 1), "--trainer.devices=2", "--trainer.strategy=ddp"),
                        dict(os.environ), stdout=open(log, "wb"))
    assert proc.wait() == 0, log.read_text()[-3000:]
    record = record_of(root)
    assert (record["status"], record["compute"]["num_devices"]) == ("completed", 2)


@pytest.mark.slow
def test_a_forked_evaluation_measures_what_a_fresh_eval_process_measures(worker, tmp_path, tiny_fit):
    """A profile's declared evaluations run forked from the slot's worker (ablation.Evaluations): `vit-ablate eval`
    there adds to the run's record the numbers a fresh eval process writes."""
    args = (*tiny_fit(3, 2), "--trainer.max_epochs=1", "--run.trial=t")
    fit = subprocess.run(fit_argv(tmp_path, *args), capture_output=True, text=True)
    assert fit.returncode == 0, fit.stderr[-2000:]
    [run] = tmp_path.glob("*/*/t")
    evaluate = ("vit-ablate", "eval", str(run), "--shots", "--shuffle-perms", "0", "--attention-images", "2")
    fresh = subprocess.run(executable((*evaluate, "--out", str(tmp_path / "fresh.json"))), capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    log = tmp_path / "eval.log"
    with open(log, "wb") as out:
        assert worker.start(executable((*evaluate, "--into-record")), dict(os.environ), stdout=out).wait() == 0, \
            log.read_text()[-2000:]
    measured = json.loads((tmp_path / "fresh.json").read_text())
    [(key, filed)] = record_of(tmp_path)["eval"].items()
    assert key == measured["key"] and filed["val/acc"] == measured["metrics"]["val/acc"]
