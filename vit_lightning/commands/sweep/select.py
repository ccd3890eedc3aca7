"""A fixed `select:<profile>` value (ablation.selected_by), set per sweep to the value that profile's runs chose.

The selecting profile is a stage of the same ablation that sweeps the key over candidates (the transfer
ablation: the paper's four fine-tuning learning rates, on a held-out part of the training images). For each
sweep block the candidate whose runs in the block's cell (same single values of the selecting profile's other
axes; its replicates, the source runs, left aside) reach the highest mean of the ablation's metric wins; on a
tie, the first candidate in the grid. Until every one of those runs has finished, the sweep refuses in one line
naming the command that makes them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from vit_lightning.ablation import load, selector
from vit_lightning.commands.sweep import trials, yamls
from vit_lightning.commands.sweep.validate import SweepError
from vit_lightning.core.identity import plain


def _single(spec: dict):
    """The parameter's one value; a list of several is no cell."""
    values = [spec["value"]] if "value" in spec else list(spec.get("values") or ())
    return values[0] if len(values) == 1 else None


def _candidates(ablation, name: str, root) -> list[trials.Trial]:
    """The selecting profile's trials, under the selecting sweep's run.root."""
    configs = [config for _, config in yamls.sweep_configs(ablation, name)]
    if root is not None:
        for config in configs:
            config["parameters"]["run.root"] = {"value": root}
    return trials.build(configs)


def choose(config: dict, key: str, name: str, directory: Path | None) -> tuple[object, list[trials.Trial]]:
    """(the selected value of key for this sweep config, the selecting runs still missing)."""
    params = config["parameters"]
    ablation = load(str(_single(params.get("run.ablation", {}))), directory)
    selecting = ablation.profile(name)
    matched = [k for k in selecting.axes if k not in (key, ablation.replicates)]
    cell = {k: _single(params[k]) if k in params else None for k in matched}
    if any(v is None for v in cell.values()):
        raise SweepError(f"{key}=select:{name} needs one value of each of {', '.join(matched)} per sweep block")
    root = _single(params.get("run.root", {}))
    mine = [t for t in _candidates(ablation, name, root)
            if all(plain(t.params[k]) == plain(v) for k, v in cell.items())]
    if not mine:
        raise SweepError(f"{key}=select:{name}: profile {name!r} of {ablation.name} has no runs in the cell "
                         + ", ".join(f"{k}={v}" for k, v in cell.items()))
    found = [(t, trials.find_record(t)) for t in mine]
    missing = [t for t, rec in found if not rec or rec.get("status") != "completed"]
    if missing:
        return None, missing
    scores: dict = {}
    for trial, rec in found:
        scores.setdefault(repr(trial.params[key]), (trial.params[key], []))[1].append(rec["metrics"][ablation.metric])
    best = max(scores.values(), key=lambda pair: statistics.fmean(pair[1]))  # max keeps the first on ties
    return best[0], []


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
