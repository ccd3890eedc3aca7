"""Hyperband early termination: stop decisions on canned histories, each worked out by hand from W&B's rule."""

from __future__ import annotations

import json

import pytest
import yaml

from vit_lightning.commands.sweep import cli
from vit_lightning.run import hyperband
from vit_lightning.run.hyperband import parse, series, sweep_histories, verdict

MAX = {"name": "val/acc", "goal": "maximize"}


def rule(metric=MAX, **early):
    return parse({"type": "hyperband", **early}, metric)


def test_brackets_from_min_iter_or_max_iter_and_s():
    assert rule(min_iter=2).bands[:4] == (2, 6, 18, 54)  # eta 3 by default
    assert rule(min_iter=1, eta=2).bands[:5] == (1, 2, 4, 8, 16)
    assert rule(max_iter=27, s=2).bands == (3, 9)  # 27/3, 27/9
    assert rule(max_iter=10, s=3).bands == (1, 3)  # 10/3 = 3.3 -> 3, 10/9 = 1.1 -> 1, 10/27 < 1: none
    assert rule(min_iter=1).strict is True  # W&B's engine fills strict: true


# five trials that reached epoch 2; sorted best first at epoch 2: 0.9, 0.8, 0.7, 0.6, 0.5.
# n = 5, eta = 3: the threshold is the value at rank floor(5/3) = 1, i.e. 0.8
FIVE = {"a": [0.2, 0.9], "b": [0.3, 0.8], "c": [0.95, 0.7], "d": [0.1, 0.6], "e": [0.4, 0.5]}


@pytest.mark.parametrize("name, strict, stops", [
    ("a", True, False), ("b", True, False),  # b ties the threshold: a tie carries on
    ("c", True, True), ("d", True, True), ("e", True, True),
    ("c", False, False),  # not strict: c's best so far (0.95 at epoch 1) clears 0.8
    ("d", False, True),  # its best, 0.6, does not
])
def test_threshold_is_the_top_third_at_the_bracket(name, strict, stops):
    r = rule(min_iter=2, strict=strict)
    reason = verdict(r, FIVE[name], list(FIVE.values()))
    assert (reason is not None) == stops
    if stops:
        assert "bracket 2" in reason and "threshold 0.8" in reason


def test_trials_that_have_not_reached_a_bracket():
    r = rule(min_iter=2)
    # one epoch: no bracket reached, so it runs on however poor it is
    assert verdict(r, [0.01], [*FIVE.values(), [0.01]]) is None
    # a trial with one epoch does not count at bracket 2: adding a poor one leaves the threshold at 0.8 (c stops),
    # adding a good one with two epochs makes n = 6, rank 2: threshold 0.8 still, b still ties
    assert verdict(r, FIVE["c"], [*FIVE.values(), [0.99]]) is not None
    assert verdict(r, FIVE["b"], [*FIVE.values(), [0.5, 0.99]]) is None
    # with n = 6 and two better than b at epoch 2 the rank-2 value is b's own: b ties, runs on
    assert verdict(r, FIVE["b"], [*FIVE.values(), [0.5, 0.85]]) is None
    # with n = 3 (rank 1): among 0.9, 0.8, 0.7 the threshold is 0.8, so c stops
    assert verdict(r, FIVE["c"], [FIVE["a"], FIVE["b"], FIVE["c"]]) is not None
    # with n = 2 (rank 0) the threshold is the best: b below a stops
    assert verdict(r, FIVE["b"], [FIVE["a"], FIVE["b"]]) is not None
    # alone, a trial is its own threshold
    assert verdict(r, FIVE["e"], [FIVE["e"]]) is None


def test_a_trial_is_judged_at_the_last_bracket_it_reached():
    r = rule(min_iter=2)  # brackets 2, 6
    fast = [0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]  # best at epoch 2, 0.9 at epoch 6
    slow = [0.1, 0.95, 0.9, 0.8, 0.7, 0.6]  # best at epoch 2 (clears bracket 2), 0.6 at epoch 6
    # at epoch 6 only fast and slow reached bracket 6: n = 2, rank 0, threshold 0.9; slow's 0.6 is below
    reason = verdict(r, slow, [fast, slow])
    assert reason is not None and "bracket 6" in reason and "threshold 0.9" in reason
    assert verdict(r, slow[:5], [fast, slow[:5]]) is None  # at epoch 5 it is judged at bracket 2, where it leads


def test_minimize_and_max_iter():
    r = rule({"name": "val/loss", "goal": "minimize"}, max_iter=9, s=1)  # one bracket: 9/3 = 3
    losses = {"x": [3, 2, 1.0], "y": [3, 2, 1.5], "z": [3, 2, 2.0], "w": [3, 2.5]}
    # at epoch 3, sorted best (lowest) first: 1.0, 1.5, 2.0; rank floor(3/3) = 1: threshold 1.5
    assert verdict(r, losses["z"], list(losses.values())) is not None
    assert verdict(r, losses["y"], list(losses.values())) is None
    assert verdict(r, losses["w"], list(losses.values())) is None  # two epochs: before the bracket


def test_missing_epochs_are_skipped_and_best_is_a_running_max():
    rows = [{"val/acc": 0.5}, {"val/acc": None}, {"val/acc": 0.4}, {}, {"val/acc": 0.7}]
    assert series(rows, "val/acc") == [0.5, 0.4, 0.7]  # the third epoch is its second iteration
    assert series(rows, "val/acc_best") == [0.5, 0.5, 0.7]
    # judged at bracket 2 (its 2nd value, epoch 3) against a trial at 0.45 there: n = 2, rank 0, threshold 0.45
    r = rule(min_iter=2)
    assert verdict(r, series(rows[:3], "val/acc"), [[0.3, 0.45], series(rows[:3], "val/acc")]) is not None
    assert verdict(rule({"name": "val/acc_best", "goal": "maximize"}, min_iter=2),
                   series(rows[:3], "val/acc_best"), [[0.3, 0.45], series(rows[:3], "val/acc_best")]) is None


@pytest.mark.parametrize("early, field", [
    ({"type": "median"}, "early_terminate.type"),
    ({"type": "hyperband"}, "min_iter, or max_iter and s"),
    ({"type": "hyperband", "min_iter": 0}, "early_terminate.min_iter"),
    ({"type": "hyperband", "min_iter": 2, "eta": 1}, "early_terminate.eta"),
    ({"type": "hyperband", "max_iter": 27}, "early_terminate.s"),
    ({"type": "hyperband", "min_iter": 3, "strict": "yes"}, "early_terminate.strict"),
    ({"type": "hyperband", "min_iters": 3}, "early_terminate.min_iters"),
    ({"type": "hyperband", "max_iter": 2, "s": 1, "eta": 3}, "no bracket"),
])
def test_bad_settings_name_the_field(early, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse(early, MAX)


def test_bad_settings_stop_the_sweep_before_anything_runs(tmp_path, capsys):
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
              "early_terminate": {"type": "hyperband", "min_iter": 2, "eta": 0.5},
              "command": ["${env}", "vit-ablate", "fit", "${args}"],
              "parameters": {"model.lr": {"values": [0.001, 0.002]}, "run.root": {"value": str(tmp_path / "runs")}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main([str(path), "--backend", "local"]) == 2
    err = capsys.readouterr().err.strip()
    assert "early_terminate.eta must be a number above 1" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()
    config["early_terminate"] = {"type": "hyperband", "min_iter": 2}
    config["metric"] = {"name": "val/acc5_best", "goal": "maximize"}  # no per-epoch value in a record
    path.write_text(yaml.safe_dump(config))
    assert cli.main([str(path), "--backend", "local"]) == 2
    assert "metric.name 'val/acc5_best' is not one" in capsys.readouterr().err


def test_the_sweep_is_the_records_with_its_fixed_settings(tmp_path):
    for name, pooling, accs in (("r1", "cls", [0.5, 0.6]), ("r2", "gap", [0.9, 0.9]), ("r3", "cls", [0.2])):
        (tmp_path / name).mkdir()
        record = {"config": {"model.pooling": pooling}, "history": [{"val/acc": a} for a in accs]}
        (tmp_path / name / "results.json").write_text(json.dumps(record))
    (tmp_path / "r4").mkdir()
    (tmp_path / "r4" / "results.json").write_text("{trunc")  # being written: not a trial yet
    assert sweep_histories(tmp_path, {"model.pooling": "cls"}, "val/acc") == {"r1": [0.5, 0.6], "r3": [0.2]}


def test_a_trials_command_carries_its_sweeps_rule_as_a_run_option_for_both_backends():
    """The rule, its metric and the sweep's fixed settings in the trial's argv: what the W&B agent runs too."""
    from tests.wandb_agent import agent_command
    from vit_lightning.ablation import load
    from vit_lightning.commands.fit.cli import fit_parser
    from vit_lightning.commands.sweep import trials, yamls

    (_, config), *_ = yamls.sweep_configs(load("cls_vs_gap"), "demo_bayes")
    flag = f"--{hyperband.OPTION}="
    (carried,) = [c for c in config["command"] if c.startswith(flag)]  # the sweep YAML's own command
    one = {k: spec.get("values", [spec.get("value")]) for k, spec in config["parameters"].items() if "distribution" not in spec}
    fixed = {k: vs[0] for k, vs in one.items() if len(vs) == 1 and not k.startswith("run.")}  # single-valued settings
    assert json.loads(carried[len(flag):]) == {"rule": config["early_terminate"], "metric": config["metric"],
                                               "fixed": fixed}
    params = {k: spec["value"] if "value" in spec else spec["values"][0] for k, spec in config["parameters"].items()
              if "distribution" not in spec} | {"model.lr": 0.001}
    trial = trials.make(config, params)
    agent_argv, _ = agent_command(config, "abc", {**params, "run.trial": trial.id})
    assert agent_argv[1:] == list(trial.command) and trial.command[-1] == carried  # wandb's own rendering
    parsed = fit_parser().parse_args(list(trial.command[2:]))
    assert hyperband.option_error(parsed[hyperband.OPTION]) is None
    stop = hyperband.HyperbandStop.from_option(parsed[hyperband.OPTION], "runs/x", list)
    assert stop.rule == parse(config["early_terminate"], config["metric"]) and stop.fixed == fixed
    # a sweep without the rule leaves it out; a changed sweep (--set) replaces a rule already in the command
    assert not any(c.startswith(flag) for c in trials.early_command({"parameters": {}}))
    changed = {**config, "parameters": {**config["parameters"], "trainer.max_epochs": {"value": 1}}}
    (again,) = [c for c in trials.early_command(changed) if c.startswith(flag)]
    assert json.loads(again[len(flag):])["fixed"]["trainer.max_epochs"] == 1


@pytest.mark.parametrize("text,problem", [
    ("{not json", "must be JSON"), ('{"rule": {"type": "median"}, "metric": {"name": "val/acc"}}', "early_terminate.type"),
    ('{"rule": {"type": "hyperband", "min_iter": 1}, "metric": {"name": "val/acc"}, "extra": 1}', "must be JSON"),
])
def test_a_bad_rule_on_fits_command_line_is_one_line_before_anything_is_written(tmp_path, capsys, text, problem):
    from tests.tiny import TINY_MODEL
    from vit_lightning.commands.fit import main as train

    argv = [*TINY_MODEL, f"--run.root={tmp_path}", "--run.wandb=off", f"--{hyperband.OPTION}={text}"]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and problem in err[0] and hyperband.OPTION in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # trains
def test_a_real_sweep_stops_the_trials_the_rule_says_and_its_table_lists_them(tmp_path, monkeypatch):
    """lr 2e-3 learns, lr 1e-7 does not: run second, the latter falls below the first at bracket 1 and stops."""
    from tests.tiny import tiny_settings
    from vit_lightning.commands.results import cli as table_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fixed = {**tiny_settings(),
             "data.name": "mnist5k", "model.patch_size": 7, "model.pooling": "gap", "model.head": "linear",
             "trainer.max_epochs": 3, "trainer.limit_train_batches": 8, "trainer.limit_val_batches": 4,
             "trainer.devices": 1, "run.root": str(tmp_path / "runs"), "run.ablation": "cls_vs_gap",
             "run.profile": "demo", "run.wandb": "off", "seed_everything": 0}
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
              "early_terminate": {"type": "hyperband", "min_iter": 1, "eta": 3},  # brackets 1, 3, 9
              "command": ["${env}", "vit-ablate", "fit", "${args}"],
              "parameters": {**{k: {"value": v} for k, v in fixed.items()}, "model.lr": {"values": [0.002, 1e-7]}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main([str(path), "--backend", "local"]) == 0
    folder = tmp_path / "runs" / "cls_vs_gap" / "demo"
    recs = {r["config"]["model.lr"]: r for r in (json.loads(p.read_text()) for p in folder.glob("*/results.json"))}
    good, poor = recs[0.002], recs[1e-7]
    assert good["status"] == "completed" and len(good["history"]) == 3  # first: alone, its own threshold
    # the rule by hand at the poor trial's first epoch: n = 2 at bracket 1, rank floor(2/3) = 0: the good one's value
    first = [good["history"][0]["val/acc"], poor["history"][0]["val/acc"]]
    assert first[1] < first[0]
    assert poor["status"] == "stopped_early" and len(poor["history"]) == 1 and "bracket 1" in poor["stopped_early"]
    assert (folder / poor["name"] / "last.ckpt").exists()
    state = json.loads((folder / ".sweep-state.json").read_text())["trials"][poor["trial"]]
    assert state["status"] == "stopped_early" and state["rc"] == 0
    # a re-run (even retrying failures) leaves both alone
    assert cli.main([str(path), "--backend", "local", "--retry-failed"]) == 0
    assert json.loads((folder / poor["name"] / "results.json").read_text())["history"] == poor["history"]
    assert table_cli.main(["cls_vs_gap", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                           "--no-figures"]) == 0
    table = "\n".join(p.read_text() for p in (tmp_path / "out").glob("*.md"))
    line = next(x for x in table.splitlines() if poor["name"] in x)
    assert "stopped early (hyperband: val/acc_best" in line
    # the rule is the trial's own option: in its record and its recorded command, which stops it again alone
    command = json.loads((folder / ".sweep-state.json").read_text())["trials"][poor["trial"]]["command"]
    assert poor["config"][hyperband.OPTION] == command[-1].split("=", 1)[1]
    from vit_lightning.commands.fit import main as train

    assert train.main([*command[2:], "--run.retrain=true"]) == 0
    again = json.loads((folder / poor["name"] / "results.json").read_text())
    assert again["status"] == "stopped_early" and len(again["history"]) == 1
