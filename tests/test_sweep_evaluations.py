"""Evaluations a profile declares (ablation.Evaluations) run after each trial of a local sweep, once each."""

from __future__ import annotations

import dataclasses
import os
import shlex

import pytest
import yaml

from vit_lightning.ablation import Evaluations, load, profile
from vit_lightning.commands.sweep import local, trials, yamls

ENC = "model.pos_encoding"
RULES = (({ENC: ["rope_axial"]}, ("--rope-scaling", "ntk")), ({ENC: "learned_1d"}, ("--pos-resample", "keep")))


def test_each_size_with_the_defaults_and_each_matching_rule_beyond_the_trained_size():
    ev = Evaluations(sizes=(36, 48, 60), rules=RULES, options=("--shots",))
    rope = ev.commands("runs/r", {ENC: "rope_axial", "data.img_size": 36})
    assert [c[3:] for c in rope] == [("--data.img_size=36", "--shots", "--into-record"),
                                     ("--data.img_size=48", "--shots", "--into-record"),
                                     ("--data.img_size=48", "--shots", "--rope-scaling", "ntk", "--into-record"),
                                     ("--data.img_size=60", "--shots", "--into-record"),
                                     ("--data.img_size=60", "--shots", "--rope-scaling", "ntk", "--into-record")]
    assert all(c[:3] == ("vit-ablate", "eval", "runs/r") for c in rope)
    assert len(ev.commands("r", {ENC: "none", "data.img_size": 36})) == 3  # no rule of its own
    assert len(ev.commands("r", {ENC: "learned_1d", "data.img_size": 36})) == 5
    some = dataclasses.replace(ev, seeds=(0, 2))  # only these seeds' trials are evaluated
    assert [len(some.commands("r", {ENC: "none", "data.img_size": 36, "seed_everything": s})) for s in range(3)] == [3, 0, 3]


def test_bad_evaluations_are_refused_by_name():
    with pytest.raises(ValueError, match="sizes are image sides"):
        Evaluations(sizes=(0,))
    with pytest.raises(ValueError, match="a non-empty partial cell"):
        Evaluations(sizes=(48,), rules=(({}, ("--x",)),))
    prof = profile("demo", {ENC: ["none"]}, seeds=[0])
    with pytest.raises(ValueError, match="matches 'model.pooling', which it neither sweeps nor fixes"):
        dataclasses.replace(prof, evaluations=Evaluations((48,), (({"model.pooling": "gap"}, ("--x",)),)))
    with pytest.raises(ValueError, match=r"evaluations' seeds must be among its seeds \[0\]"):
        dataclasses.replace(prof, evaluations=Evaluations((48,), seeds=(1,)))


def test_the_tasks_profile_declares_its_canvases_for_every_trial():
    """6 canvases per run of seeds 0-2; the 5 larger ones again per rule: RoPE twice (2 encodings x 3 tasks with the
    [class] token, x 2 tasks with GAP), the kept tables (3 encodings x 3 tasks) once."""
    prof = load("pos_diagnostic").profile("tasks")
    built = trials.with_evaluations(trials.build([c for _, c in yamls.sweep_configs(load("pos_diagnostic"), "tasks")]))
    assert len(built) == len(prof.trials()) == (14 * 3 + 3 * 2) * 5
    assert sum(len(t.evaluations) for t in built) == 48 * 3 * 6 + ((2 * 3 + 2 * 2) * 2 + 3 * 3) * 3 * 5
    rope = next(t for t in built if t.params[ENC] == "rope_mixed" and t.params["model.pooling"] == "gap")
    assert {shlex.join(c).split(" --data.img_size=")[1] for c in rope.evaluations} >= {
        "168 --shots --shuffle-perms 0 --attention-images 16 --rope-scaling yarn --into-record"}


EVAL_STAND_IN = r'''
import json, os, pathlib, sys
run, size = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(os.environ["FAKE_MARKER"], "a") as f:
    f.write(f"eval{size} {run.name}\n")
sys.exit(3 if size == os.environ.get("FAKE_EVAL_FAILS") else 0)
'''


def test_a_sweep_evaluates_each_finished_trial_once_and_resumes_what_is_left(stand_in, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "marker.txt"))
    script = tmp_path / "fake_eval.py"
    script.write_text(EVAL_STAND_IN)
    config = yaml.safe_load(open(stand_in.sweep()))

    def sweep(sizes, fails=None):
        built = [dataclasses.replace(t, evaluations=tuple(("python", str(script), str(t.run_dir), s) for s in sizes))
                 for t in trials.build([config])]
        monkeypatch.setenv("FAKE_EVAL_FAILS", fails or "none")
        return local.Runner(built, [{}], fork=False, log=lambda _: None).run()

    assert sweep(["48", "60"], fails="60") == 1  # an evaluation that fails fails the sweep and stays to do
    events = stand_in.events()
    assert [e.split()[0] for e in events].count("end") == 4
    assert [e.split()[0] for e in events].count("eval48") == 4 and [e.split()[0] for e in events].count("eval60") == 4
    assert all(len(t["evaluated"]) == 1 for t in stand_in.state().values())
    os.remove(tmp_path / "marker.txt")
    assert sweep(["48", "60", "84"]) == 0  # the trials are done: only the evaluations left run, no fit
    assert sorted(e.split()[0] for e in stand_in.events()) == ["eval60"] * 4 + ["eval84"] * 4
    assert all(len(t["evaluated"]) == 3 for t in stand_in.state().values())
    os.remove(tmp_path / "marker.txt")
    assert sweep(["48", "60", "84"]) == 0 and stand_in.events() == []  # nothing left


def test_the_dry_run_lists_each_evaluation_after_its_trial_and_states_the_projection(capsys, tmp_path, monkeypatch):
    from vit_lightning.commands.sweep import cli

    monkeypatch.chdir(tmp_path)  # no runs here: every trial is to run
    assert cli.main(["pos_diagnostic", "--profile", "tasks", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("240 to run, 0 failed; 1299 evaluations declared after them")
    first = lines.index(next(line for line in lines if line.startswith("vit-ablate fit")))
    assert lines[first + 1].startswith("vit-ablate eval runs/pos_diagnostic/tasks/") and "--data.img_size=36" in lines[first + 1]
    assert sum(line.startswith("vit-ablate eval") for line in lines) == 1299
    assert lines[-1] == f"# projected (pos_diagnostic, profile tasks): {load('pos_diagnostic').profile('tasks').projected}"
