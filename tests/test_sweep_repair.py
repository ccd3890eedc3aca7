"""Damaged sweep files before anything trains: bayes journals (truncated, empty, the wrong type) and sweep states
named in one line with what to do, rebuilt from the records; `running` entries of dead processes interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_sweep_search import config, drive

from vit_lightning.commands.sweep import cli, local, repair
from vit_lightning.commands.sweep.search import Search
from vit_lightning.commands.sweep.trials import make
from vit_lightning.run import rundir

DAMAGE = {"truncated": '{"proposals": [{"id": "lr', "empty": "", "a list": "[1, 2]",
          "proposals a string": '{"proposals": "none"}', "a proposal without raw": '{"proposals": [{"id": "x"}]}'}


def sweep_file(tmp_path: Path, cap: int = 4) -> Path:
    path = tmp_path / "bayes.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path / "runs", cap)))
    return path


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_journal_is_one_line_before_anything_runs_dry_run_included(tmp_path, capsys, damage):
    path = sweep_file(tmp_path)
    search = Search(config(tmp_path / "runs", 4), 4)
    search.journal.parent.mkdir(parents=True)
    search.journal.write_text(DAMAGE[damage])
    for extra in (["--dry-run"], []):
        code = cli.main([str(path), "--backend", "local", *extra])
        out, err = capsys.readouterr()
        [line] = err.strip().splitlines()
        assert code == 2 and out == "" and str(search.journal) in line and "damaged bayes journal" in line, err
        assert "--repair" in line and "move it aside" in line
    assert search.journal.read_text() == DAMAGE[damage]  # nothing written, nothing trained
    assert not list(search.folder.glob("*/results.json"))


def test_repair_rebuilds_a_journal_from_the_records_and_the_search_goes_on(tmp_path, capsys):
    first = Search(config(tmp_path, 6), 6)
    assert len(drive(Search(config(tmp_path, 4), 4))) == 4  # four finished proposals
    before = {p["id"]: p["raw"] for p in first.proposals()}
    first.journal.write_text(first.journal.read_text()[:40])  # truncated mid-write
    said = []
    repair.check([], [first], repair=True, dry_run=True, log=said.append)
    assert "--repair without --dry-run rebuilds it" in said[0] and len(first.journal.read_text()) == 40
    repair.check([], [first], repair=True, dry_run=False, log=said.append)
    assert "rebuilt from the records: 4 proposal(s)" in said[1] and str(first.journal) in said[1]
    assert first.journal.with_name(first.journal.name + ".damaged").exists()
    after = {p["id"]: p["raw"] for p in first.proposals()}
    assert after.keys() == before.keys()
    for trial_id, raw in before.items():
        assert after[trial_id] == pytest.approx(raw, rel=1e-12)
    again = Search(config(tmp_path, 6), 6)
    new = again.next()
    assert new is not None and new.id not in before  # the search goes on, nothing trained twice


@pytest.mark.parametrize("damage", ["truncated", "empty", "a list"])
def test_a_damaged_state_is_named_and_rebuilt_from_the_records_by_the_next_run(tmp_path, damage):
    cfg = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
           "command": ["${env}", "vit-ablate", "fit", "${args}"], "parameters": {}}
    done, failed = (make(cfg, {"run.root": str(tmp_path), "model.lr": lr}, 0) for lr in (0.1, 0.2))
    for trial, status in ((done, "completed"), (failed, "failed")):
        trial.run_dir.mkdir(parents=True)
        (trial.run_dir / "results.json").write_text(json.dumps({"trial": trial.id, "status": status}))
    path = done.record_dir / local.STATE
    path.write_text(DAMAGE[damage])
    said = []
    repair.check([done, failed], [], repair=False, dry_run=True, log=said.append)
    [line] = said
    assert line.startswith(f"[sweep] {path}: damaged sweep state (") and "the next run rebuilds it" in line
    assert path.read_text() == DAMAGE[damage]  # a dry run writes nothing
    repair.check([done, failed], [], repair=False, dry_run=False, log=said.append)
    assert "rebuilt from the records: 2 trial(s)" in said[1] and len(said) == 2
    state = json.loads(path.read_text())["trials"]
    assert state[done.id]["status"] == "completed" and state[failed.id]["status"] == "failed"
    assert state[done.id]["command"] == list(done.command)
    assert path.with_name(local.STATE + ".damaged").read_text() == DAMAGE[damage]


def test_a_running_entry_of_a_dead_process_is_reported_interrupted(tmp_path):
    cfg = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
           "command": ["${env}", "vit-ablate", "fit", "${args}"], "parameters": {}}
    dead, alive = (make(cfg, {"run.root": str(tmp_path), "model.lr": lr}, 0) for lr in (0.1, 0.2))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    state = local.State()
    for trial in (dead, alive):
        trial.run_dir.mkdir(parents=True)
        state.update(trial, status="running", pid=int(gone.stdout), host="node7")
    held = rundir.acquire(alive.run_dir)  # a live process on another node still trains this one
    try:
        said = []
        runner = local.Runner([dead, alive], [{}], log=said.append)
        runner.plan()
    finally:
        rundir.release(held)
    assert said[0] == (f"[sweep] trial 1/2 was left running by pid {gone.stdout.strip()} on node7, which is gone: "
                       "interrupted (it runs again, resuming from its checkpoint)")
    assert not any("trial 2/2" in line for line in said)
    assert state.get(dead)["status"] == "interrupted" and state.get(dead)["pid"] is None
    assert state.get(alive)["status"] == "running"


@pytest.mark.parametrize("name, shots, ok", [("val/accuracy", None, False), ("val/acc_best", None, True),
                                             ("val/fewshot5", None, True), ("val/fewshot5", [], False),
                                             ("val/fewshot10", [10], True)])
def test_a_bayes_metric_no_trial_logs_is_refused_before_training(tmp_path, capsys, name, shots, ok):
    """A typo in metric.name would leave the sampler told that every point failed: refused as hyperband does."""
    spec = config(tmp_path / "runs", 2)
    spec["metric"]["name"] = name
    if shots is not None:
        spec["parameters"]["run.fewshot_shots"] = {"value": shots}
    path = tmp_path / "bayes.yaml"
    path.write_text(yaml.safe_dump(spec))
    code = cli.main([str(path), "--backend", "local", "--dry-run"])
    out, err = capsys.readouterr()
    if ok:
        assert code == 0, err
        return
    [line] = err.strip().splitlines()
    assert code == 2 and f"method bayes needs a metric a trial records; metric.name {name!r} is not one" in line
    assert "val/acc_best" in line and "val/acc_shuffled" in line and ("val/fewshot1_std" in line) == (shots is None)
