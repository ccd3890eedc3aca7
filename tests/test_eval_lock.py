"""`eval --into-record` and `fit` exclude each other through the run's lock at every phase of the fit: a fit still
being built when the eval starts is refused once it reaches the run, a fit training or finishing refuses the eval,
and a finished one lets it in; nothing is written by the one refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import TINY_MODEL

from vit_lightning import cli
from vit_lightning.analysis import evaluate
from vit_lightning.commands.fit import main as train
from vit_lightning.run import rundir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a fit process per test: minutes on a busy CPU

FIT = [*TINY_MODEL, "--data.batch_size=32", "--trainer.max_epochs=1", "--trainer.limit_train_batches=3",
       "--trainer.limit_val_batches=2", "--run.wandb=off", "--run.fewshot_shots=[]", "--data.name=synthetic",
       "--data.img_size=32", "--model.patch_size=8", "--run.trial=src"]
PAUSE = '''
import os, time
from pathlib import Path
from lightning.pytorch import Callback


def pause(phase):
    """Wait at `phase` (one of $PAUSE_AT) until the test creates go-<phase> in $PAUSE_DIR."""
    if phase in os.environ.get("PAUSE_AT", "").split(","):
        folder = Path(os.environ["PAUSE_DIR"])
        (folder / phase).write_text(str(os.getpid()))
        while not (folder / f"go-{phase}").exists():
            time.sleep(0.05)


class PauseAt(Callback):
    """Holds fit at a phase: built (before it takes its run), training (after a step), fit_end (final write)."""

    def __init__(self):
        pause("built")

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 1:
            pause("training")

    def on_fit_end(self, trainer, pl_module):
        pause("fit_end")
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    assert train.main([*FIT, f"--run.root={root}"]) == 0
    return root


def start_fit(root: Path, tmp_path: Path, phases: str) -> subprocess.Popen:
    """`vit-ablate fit` training the run again (retrain), held at the given phases."""
    (tmp_path / "pauseat.py").write_text(PAUSE)
    env = {**os.environ, "PAUSE_AT": phases, "PAUSE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "vit_lightning.cli", "fit", *FIT, f"--run.root={root}", "--run.retrain=true",
            "--trainer.callbacks=pauseat.PauseAt"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def reach(tmp_path: Path, phase: str, fit: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not (tmp_path / phase).exists():
        assert fit.poll() is None, fit.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"fit never reached {phase}"
        time.sleep(0.1)


def evaluate_into(run_dir: Path, out: Path, capsys) -> tuple[int, list[str]]:
    code = cli.main(["eval", str(run_dir), "--shots", "1", "--shuffle-perms", "0", "--into-record", "--out", str(out)])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_fit_training_or_finishing_refuses_the_eval_and_a_finished_one_lets_it_in(trained, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(trained, root)
    run_dir = root / "adhoc" / "local" / "src"
    fit = start_fit(root, tmp_path, "training,fit_end")
    try:
        for phase in ("training", "fit_end"):
            reach(tmp_path, phase, fit)
            code, err = evaluate_into(run_dir, tmp_path / f"{phase}.json", capsys)
            assert code == 2 and len(err) == 1 and "is being trained by pid" in err[0], (phase, err)
            assert not (tmp_path / f"{phase}.json").exists()
            (tmp_path / f"go-{phase}").touch()
        assert fit.wait(timeout=300) == 0, fit.stdout.read()[-3000:]
    finally:
        if fit.poll() is None:
            fit.kill()
    assert "eval" not in json.loads((run_dir / "results.json").read_text())
    code, err = evaluate_into(run_dir, tmp_path / "after.json", capsys)
    assert code == 0, err
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and list(record["eval"]) == ["synthetic@32px/native"]


def test_a_fit_that_reaches_its_run_while_an_eval_works_there_is_refused(trained, tmp_path, capsys, monkeypatch):
    root = tmp_path / "runs"
    shutil.copytree(trained, root)
    run_dir = root / "adhoc" / "local" / "src"
    before = json.loads((run_dir / "results.json").read_text())
    fit = start_fit(root, tmp_path, "built")
    real_run, seen = evaluate.run, {}

    def run_while_the_fit_comes(args, changes):
        result = real_run(args, changes)
        (tmp_path / "go-built").touch()  # the fit goes on to take its run while this eval holds it
        seen["code"] = fit.wait(timeout=300)
        seen["said"] = fit.stdout.read()
        return result

    monkeypatch.setattr(evaluate, "run", run_while_the_fit_comes)
    try:
        reach(tmp_path, "built", fit)
        code, err = evaluate_into(run_dir, tmp_path / "e.json", capsys)
    finally:
        if fit.poll() is None:
            fit.kill()
    assert code == 0, err
    assert seen["code"] == rundir.BUSY and "not started: a run dir has one writer at a time" in seen["said"]
    record = json.loads((run_dir / "results.json").read_text())
    assert list(record["eval"]) == ["synthetic@32px/native"]  # the eval's numbers, on the record the fit left alone
    assert {k: v for k, v in record.items() if k not in ("eval", "updated_at")} == before


def test_evaluations_of_one_run_by_several_processes_all_reach_its_record_and_keep_a_fit_out(trained, tmp_path,
                                                                                             capsys):
    """An eval holding its share of the run (another process evaluating it) lets a second one in, which adds its
    numbers beside the first's; a fit meanwhile is refused as the run is being evaluated."""
    root = tmp_path / "runs"
    shutil.copytree(trained, root)
    run_dir = root / "adhoc" / "local" / "src"
    rundir.update_record(run_dir, lambda record: record.setdefault("eval", {}).update({"synthetic@40px/zoom": {}}))
    with rundir.held(run_dir, shared=True):  # another eval at work on this run
        code, err = evaluate_into(run_dir, tmp_path / "e.json", capsys)
        assert code == 0, err
        with pytest.raises(rundir.Busy, match="being evaluated"):
            rundir.acquire(run_dir)  # what a fit takes first
    record = json.loads((run_dir / "results.json").read_text())
    assert set(record["eval"]) == {"synthetic@40px/zoom", "synthetic@32px/native"}  # merged, none lost
    # two eval processes at once: both finish, and the record holds both evaluations
    argv = [sys.executable, "-m", "vit_lightning.cli", "eval", str(run_dir), "--shots", "1", "--shuffle-perms", "0",
            "--into-record"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*argv, f"--data.img_size={size}", "--out", str(tmp_path / f"{size}.json")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for size in (24, 48)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stdout.read()[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert {"synthetic@24px/both", "synthetic@48px/both"} <= set(record["eval"])
