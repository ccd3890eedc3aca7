"""W&B's published sweep engine (the `sweeps` package, the release pinned in tests/oracles.txt) as the oracle of the project's
reading of its rules: grid expansion of every committed sweep YAML, and hyperband's verdicts on generated histories."""

from __future__ import annotations

import dataclasses
import random
import warnings
from pathlib import Path

import pytest
import yaml

from vit_lightning.commands.sweep import expand
from vit_lightning.run import hyperband

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # its numpy pin: the functions used here run on numpy 2 as well
    from sweeps.grid_search import grid_search_next_runs
    from sweeps.hyperband_stopping import hyperband_stop_runs
    from sweeps.run import RunState, SweepRun

    import sweeps

ROOT = Path(__file__).resolve().parent.parent
YAMLS = sorted((ROOT / "sweeps").glob("*.yaml"))
PINNED = "0.3.0"  # the release whose hyperband reads bracket b at the b-th value (0.2.0 read the (b+1)-th)


def test_the_pinned_engine_is_installed():
    pin = next(line for line in (ROOT / "tests" / "oracles.txt").read_text().splitlines() if "sweeps==" in line)
    assert pin == f"sweeps=={PINNED}" and sweeps.__version__ == PINNED


def test_every_committed_grid_expands_to_the_engines_runs_in_its_order():
    grids = 0
    for path in YAMLS:
        config = yaml.safe_load(path.read_text())
        if config["method"] != "grid":
            continue
        ours = expand.expand(config)
        engine = grid_search_next_runs([], config, n=len(ours) + 1)
        assert engine[-1] is None, f"{path.name}: the engine has more runs than the project's {len(ours)}"
        theirs = [{k: v["value"] for k, v in run.config.items()} for run in engine[:-1]]
        assert theirs == ours, path.name  # the same runs in the same order
        grids += 1
    assert grids > 100  # every grid file was compared, not a handful


def test_the_engines_schema_accepts_each_kind_of_committed_sweep():
    """Every searched sweep and the first file of each ablation and profile (0.15 s a file: not all 190)."""
    kinds = {}
    for path in YAMLS:
        config = yaml.safe_load(path.read_text())
        kinds.setdefault(path.stem.rsplit("-", 1)[0] if config["method"] == "grid" else path.stem, (path, config))
    for path, config in kinds.values():
        assert not sweeps.schema_violations_from_proposed_config(config), path.name
    assert any(config["method"] == "bayes" for _, config in kinds.values())


def random_case(rng: random.Random) -> tuple[dict, dict, list[list[float]]]:
    """A hyperband rule (integer or not: eta, min_iter or max_iter and integer s, strict or not), a metric and
    6 to 14 histories of 0 to 12 epochs."""
    eta = rng.choice([2, 3, 4, round(rng.uniform(1.1, 4.5), 3)])
    early = {"type": "hyperband", "eta": eta}
    if rng.random() < 0.5:
        early["min_iter"] = rng.randint(1, 4)
    else:
        early.update(max_iter=rng.randint(4, 40), s=rng.randint(1, 4))
    if rng.random() < 0.8:
        early["strict"] = rng.random() < 0.5
    metric = {"name": "val/acc", "goal": rng.choice(["maximize", "minimize"])}
    histories = [[round(rng.random(), 2) for _ in range(rng.randint(0, 12))] for _ in range(rng.randint(6, 14))]
    return early, metric, histories


def engine_stops(early: dict, metric: dict, histories: list[list[float]], running: set[int]) -> set[int]:
    """The indices of the running histories the engine stops."""
    runs = [SweepRun(name=str(k), state=RunState.running if k in running else RunState.finished,
                     history=[{metric["name"]: v} for v in h]) for k, h in enumerate(histories)]
    config = {"method": "grid", "metric": metric, "early_terminate": early, "parameters": {"a": {"values": [1]}}}
    return {int(run.name) for run in hyperband_stop_runs(runs, config)}


def disagreements(cases: int = 400, seed: int = 0) -> list[str]:
    """The generated cases where a running trial's verdict (stop or go on) differs between the project and engine."""
    rng, out = random.Random(seed), []
    for case in range(cases):
        early, metric, histories = random_case(rng)
        running = {k for k in range(len(histories)) if rng.random() < 0.7}
        rule = hyperband.parse(early, metric)
        ours = {k for k in running if hyperband.verdict(rule, histories[k], histories)}
        theirs = engine_stops(early, metric, histories, running)
        if ours != theirs:
            out.append(f"case {case} {early} {metric['goal']}: project stops {sorted(ours)}, engine {sorted(theirs)}")
    return out


def test_hyperband_verdicts_equal_the_engines_on_generated_histories():
    found = disagreements()
    assert not found, "\n".join(found[:5])


def test_noninteger_s_is_read_as_its_ceiling_where_the_engine_refuses_it():
    """The schema types s as a number, but the engine's `range(s)` takes integers only: the project reads
    ceil(s) brackets (docs/search.md says so), a difference this test shows rather than hides."""
    rule = hyperband.parse({"type": "hyperband", "max_iter": 27, "s": 1.5}, {"name": "val/acc"})
    assert rule.bands == (3, 9)  # 27/3, 27/9: two brackets for s = 1.5
    with pytest.raises(TypeError):
        engine_stops({"type": "hyperband", "max_iter": 27, "s": 1.5}, {"name": "val/acc", "goal": "maximize"},
                     [[0.1] * 10, [0.2] * 10], {0})


@pytest.mark.parametrize("drift", ["bracket one epoch later", "strict flipped"])
def test_the_comparison_catches_a_drifted_rule(monkeypatch, drift):
    """A project rule shifted by one epoch (the 0.2.0 engine's reading) or with `strict` flipped disagrees."""
    real = hyperband.parse

    def drifted(early, metric):
        rule = real(early, metric)
        if drift == "strict flipped":
            return dataclasses.replace(rule, strict=not rule.strict)
        return dataclasses.replace(rule, bands=tuple(b + 1 for b in rule.bands))

    monkeypatch.setattr(hyperband, "parse", drifted)
    assert len(disagreements(cases=200)) >= 5
