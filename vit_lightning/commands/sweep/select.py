"""A fixed `select:<profile>` value (ablation.selected_by), set per sweep to the value that profile's runs chose.

The selecting profile is a stage of the same ablation that sweeps the key over candidates (the transfer
ablation: the paper's four fine-tuning learning rates, on a held-out part of the training images). For each
sweep block the candidate whose runs in the block's cell (same single values of the selecting profile's other
axes; its replicates, the source runs, left aside) reach the highest mean of the ablation's metric wins; on a
tie, the first candidate in the grid. Until every one of those runs has finished, the sweep refuses in one line
naming the command that makes them.

A choice at the edge of the candidates tried is a bound, not an optimum: `vit-ablate sweep ABLATION --profile STAGE
--extend-edges` trains each such cell of the stage at the next value past its edge (ablation.beyond: the grid's own
step there), one cell at a time, and the values so trained count as candidates of their cell from then on (its
selection walks outward through every finished one), until each cell's best lies inside the values tried.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

from vit_lightning.ablation import beyond, load, selector
from vit_lightning.commands.sweep import trials, yamls
from vit_lightning.commands.sweep.validate import SweepError
from vit_lightning.core.identity import plain
from vit_lightning.core.names import SEED_KEY


def _single(spec: dict):
    """The parameter's one value; a list of several is no cell."""
    values = [spec["value"]] if "value" in spec else list(spec.get("values") or ())
    return values[0] if len(values) == 1 else None


def _values(spec: dict) -> list:
    """The parameter's values, one or several."""
    return [spec["value"]] if "value" in spec else list(spec.get("values") or ())


def _selecting(ablation, name: str, root) -> list[dict]:
    """The selecting profile's sweep configs, under the selecting sweep's run.root."""
    configs = [config for _, config in yamls.sweep_configs(ablation, name)]
    if root is not None:
        for config in configs:
            config["parameters"]["run.root"] = {"value": root}
    return configs


def _at(config: dict, key: str, values: list) -> dict:
    """The config with `key` swept over `values` instead."""
    out = copy.deepcopy(config)
    out["parameters"][key] = {"values": list(values)}
    return out


def _scored(config: dict, key: str, values: list, metric: str, cell: dict) -> tuple[dict, list]:
    """({value: its finished runs' metrics} in the cell, its trials there without a finished record) at `values`."""
    scores: dict = {}
    missing = []
    for trial in trials.build([_at(config, key, values)]):
        if any(plain(trial.params[k]) != plain(v) for k, v in cell.items()):
            continue
        record = trials.find_record(trial)
        if not record or record.get("status") != "completed":
            missing.append(trial)
            continue
        scores.setdefault(repr(trial.params[key]), (trial.params[key], []))[1].append(record["metrics"][metric])
    return scores, missing


def reach(config: dict, key: str, metric: str, cell: dict) -> tuple[dict, list]:
    """({repr(value): (value, metrics)} of every value of `key` tried in the cell, the block's grid in its order then
    each value past an edge whose runs have finished, walking outward; the grid's trials without a finished record)."""
    grid = _values(config["parameters"][key])
    scores, missing = _scored(config, key, grid, metric, cell)
    for upward in (True, False):
        tried = [v for v, _ in scores.values()]
        while len(tried) >= 2:
            found, _ = _scored(config, key, [beyond(tried, upward)], metric, cell)
            if not found:
                break
            scores.update(found)
            tried += [v for v, _ in found.values()]
    return scores, missing


def _best(scores: dict):
    """The value with the highest mean metric (the first on ties)."""
    return max(scores.values(), key=lambda pair: statistics.fmean(pair[1]))[0]  # max keeps the first on ties


def choose(config: dict, key: str, name: str, directory: Path | None) -> tuple[object, list[trials.Trial]]:
    """(the selected value of key for this sweep config, the selecting runs still missing)."""
    params = config["parameters"]
    ablation = load(str(_single(params.get("run.ablation", {}))), directory)
    selecting = ablation.profile(name)
    matched = [k for k in selecting.axes if k not in (key, ablation.replicates)]
    cell = {k: _single(params[k]) if k in params else None for k in matched}
    if any(v is None for v in cell.values()):
        raise SweepError(f"{key}=select:{name} needs one value of each of {', '.join(matched)} per sweep block")
    scores: dict = {}
    missing: list = []
    for block in _selecting(ablation, name, _single(params.get("run.root", {}))):
        found, waiting = reach(block, key, ablation.metric, cell)
        missing += waiting
        for value, (raw, metrics) in found.items():
            scores.setdefault(value, (raw, []))[1].extend(metrics)
    if not scores and not missing:
        raise SweepError(f"{key}=select:{name}: profile {name!r} of {ablation.name} has no runs in the cell "
                         + ", ".join(f"{k}={v}" for k, v in cell.items()))
    return (None, missing) if missing else (_best(scores), [])


def selected_key(ablation, stage: str) -> str:
    """The key other profiles of the ablation select from `stage` (their `select:<stage>` value); SweepError else."""
    keys = sorted({k for prof in ablation.profiles.values() for k, v in prof.fixed.items() if selector(v) == stage})
    if len(keys) == 1:
        return keys[0]
    stages = sorted({selector(v) for prof in ablation.profiles.values() for v in prof.fixed.values()} - {None})
    if keys:
        raise SweepError(f"--extend-edges: profile {stage!r} of {ablation.name} selects {', '.join(keys)}: it extends "
                         "a stage that selects one key")
    held = f"its selection stages: {', '.join(stages)}" if stages else "it has no selection stage"
    raise SweepError(f"--extend-edges: profile {stage!r} of {ablation.name} is no selection stage (no profile selects "
                     f"a value from it); {held}")


def _cells(config: dict, key: str) -> list[dict]:
    """The distinct cells of a config's trials: the swept values but `key` and the seed."""
    swept = [k for k, spec in config["parameters"].items() if "values" in spec and k not in (key, SEED_KEY)]
    cells: list[dict] = []
    for trial in trials.build([config]):
        cell = {k: trial.params[k] for k in swept}
        if cell not in cells:
            cells.append(cell)
    return cells


def extend_edges(configs: list[dict], directory: Path | None = None) -> tuple[list[dict], list[str]]:
    """A selection stage's sweep configs cut to what `--extend-edges` trains: for each cell whose best value is at an
    edge of the 3 or more tried (the grid's and the extensions finished), that cell alone at the next value past the
    edge; and one line per cell saying what it adds, or that its best is interior. SweepError (one line) for a sweep
    of no selection stage, or while the stage's own values have not all finished in a cell."""
    out, lines = [], []
    for config in configs:
        params = config["parameters"]
        ablation = load(str(_single(params.get("run.ablation", {}))), directory)
        stage = str(_single(params.get("run.profile", {})))
        key = selected_key(ablation, stage)
        shown = [k for k in ablation.profile(stage).axes if k not in (key, ablation.replicates)]
        for cell in _cells(config, key):
            scores, missing = reach(config, key, ablation.metric, cell)
            if missing:
                raise SweepError(f"--extend-edges: {len(missing)} run(s) of {stage} at its own values have not "
                                 f"finished; make them first: vit-ablate sweep {ablation.name} --profile {stage}")
            name = "/".join(str(plain(cell[k])) for k in shown if k in cell) or stage
            tried, best = sorted(v for v, _ in scores.values()), _best(scores)
            if len(tried) < 3:
                lines.append(f"{name}: {len(tried)} value(s) of {key} tried, too few to place a best: nothing added")
            elif tried[0] < best < tried[-1]:
                lines.append(f"{name}: best {key}={best} is interior ({tried[0]} to {tried[-1]} tried): nothing added")
            else:
                upward = best == tried[-1]
                value = beyond(tried, upward)
                lines.append(f"{name}: best {key}={best} is the {'largest' if upward else 'smallest'} tried: adds "
                             f"{value}")
                fixed = _at(config, key, [value])
                fixed["parameters"].update({k: {"values": [v]} for k, v in cell.items()})
                fixed["name"] = f"{config['name']}-{name.replace('/', '-')}-{key}{value}"  # a W&B sweep of its own
                out.append(fixed)
    return out, lines


def resolve(configs: list[dict], directory: Path | None = None, options: str = "") -> list[dict]:
    """Every `select:` value set to the value its selecting runs chose; SweepError (one line) while some of them
    have not finished, naming the sweeps that make them (`options` added to each command)."""
    missing: dict[tuple[str, str], set[str]] = {}
    for config in configs:
        for key, spec in config["parameters"].items():
            name = selector(spec.get("value"))
            if name is None:
                continue
            try:
                value, waiting = choose(config, key, name, directory)
            except SweepError:
                raise
            except ValueError as err:  # an unknown ablation or selecting profile: one line
                raise SweepError(f"{key}=select:{name}: {err}") from None
            for trial in waiting:
                missing.setdefault((trial.params["run.ablation"], name), set()).add(trial.id)
            spec["value"] = value
    if missing:
        count = sum(map(len, missing.values()))
        make = " && ".join(f"vit-ablate sweep {a} --profile {p}{options}" for a, p in missing)
        raise SweepError(f"{count} run(s) of the selection stage have not finished "
                         f"({'; '.join(f'{a}/{p}' for a, p in missing)}); make them first: {make}")
    return configs
