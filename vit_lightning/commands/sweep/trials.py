"""Trials of a sweep: expanded configs, the command line the W&B agent would run, and their records."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vit_lightning.commands.sweep.expand import expand, render_args
from vit_lightning.core.identity import TRIAL_KEY, normalize, run_dir, world_size
from vit_lightning.core.names import RECORD, SEED_KEY
from vit_lightning.model.family import trial_name
from vit_lightning.run import hyperband
from vit_lightning.run.rundir import load_record

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]  # W&B's default


@dataclass(frozen=True)
class Trial:
    """One run of a sweep: its parameters, its id, `${args}` and full command line (both carrying the id)."""

    params: dict[str, Any]
    id: str  # family.trial_name(params, world size): fit names the run dir with it and writes it into results.json
    args: tuple[str, ...]
    command: tuple[str, ...]  # as the agent would run it (without the `/usr/bin/env` prefix)
    # what the local sweep evaluates on the run once it has finished (its profile's Evaluations): command lines
    evaluations: tuple[tuple[str, ...], ...] = ()

    @property
    def run_dir(self) -> Path:
        """{run.root}/{run.ablation}/{run.profile}/{id}: where fit writes this trial's record."""
        return run_dir({**self.params, TRIAL_KEY: self.id})

    @property
    def record_dir(self) -> Path:
        """{run.root}/{run.ablation}/{run.profile}: the folder of the sweep's runs (and its state)."""
        return self.run_dir.parent

    def shell(self) -> str:
        return shlex.join(self.command)


def _macro_args(params: dict[str, Any]) -> dict[str, list[str]]:
    """The agent's `${args*}` forms of one trial's parameters."""
    return {
        "args": render_args(params),
        "args_no_hyphens": [f"{k}={v}" for k, v in params.items()],
        "args_no_equals": [s for k, v in params.items() for s in (f"--{k}", str(v))],
        "args_no_boolean_flags": [f"--{k}" if v is True else f"--{k}={v}" for k, v in params.items() if v is not False],
        "args_json": [json.dumps(params)],
    }


def command_line(config: dict, params: dict[str, Any]) -> list[str]:
    """The agent's command for one trial: macros filled in as `wandb agent` does."""
    macros = {**_macro_args(params), "env": [], "interpreter": ["python"], "program": [str(config.get("program", ""))]}
    out: list[str] = []
    for chunk in map(str, early_command(config)):
        chunk = re.sub(r"\$\{envvar:([A-Z0-9_]*)\}", lambda m: os.environ.get(m.group(1), m.group(1)), chunk)
        if chunk.startswith("${") and chunk.endswith("}"):
            if chunk[2:-1] not in macros:
                supported = ", ".join("${" + m + "}" for m in macros)
                raise ValueError(f"command macro {chunk} is not supported; use {supported}")
            out += macros[chunk[2:-1]]
        else:
            out.append(chunk)
    return out


def executable(command: tuple[str, ...]) -> list[str]:
    """The command as this machine runs it: vit-ablate and python from this environment."""
    head, rest = command[0], list(command[1:])
    if head == "vit-ablate":
        script = Path(sys.executable).with_name("vit-ablate")
        return [str(script), *rest] if script.exists() else [sys.executable, "-m", "vit_lightning.cli", *rest]
    if head == "python":
        return [sys.executable, *rest]
    return list(command)


def early_command(config: dict) -> list:
    """The sweep's command carrying its hyperband rule as fit's `--run.early_terminate` (hyperband.OPTION) when it
    has `early_terminate`, so the command a trial runs and records reproduces it; the command as it is otherwise.

    The rule is judged against the sweep's trials: the records in its folder whose single-valued settings
    (`fixed`) are its own. A rule already in the command is replaced by the sweep's as it is now (after `--set`).
    """
    flag = f"--{hyperband.OPTION}="
    command = [c for c in config.get("command") or DEFAULT_COMMAND if not str(c).startswith(flag)]
    if "early_terminate" not in config:
        return command
    fixed = {name: spec["value"] if "value" in spec else spec["values"][0]
             for name, spec in config["parameters"].items()
             if not name.startswith("run.") and ("value" in spec or len(spec.get("values") or ()) == 1)}
    seeds = config["parameters"].get(SEED_KEY) or {}
    # a bayes search trains each point at the seed's values: hyperband judges points (their mean over seeds)
    replicate = SEED_KEY if config.get("method") == "bayes" and len(seeds.get("values") or ()) > 1 else None
    return [*command, flag + hyperband.setting(config["early_terminate"], config["metric"], fixed, replicate)]


def make(config: dict, params: dict[str, Any], gpus: int = 0) -> Trial:
    """One trial of a sweep config, handed its id as `--run.trial`."""
    named = params
    if params.get(SOURCE_KEY):  # one name for every spelling of the source's path
        from vit_lightning.run.transfer import named_by_source  # torch: only for sweeps that name a source

        named = named_by_source(params)
    given = {**params, TRIAL_KEY: trial_name(named, world_size(params, gpus))}
    return Trial(params, given[TRIAL_KEY], tuple(render_args(given)), tuple(command_line(config, given)))


def build(configs: list[dict], count: int | None = None, seed: int = 0, gpus: int = 0) -> list[Trial]:
    """Every trial of the grid and random sweeps, in order, each distinct run once (bayes: search.py proposes).

    `gpus`: how many GPUs each trial will see (its slot's group), which decides `trainer.devices=auto`.
    """
    trials: dict[Path, Trial] = {}
    for config in configs:
        if config.get("method") == "bayes":
            continue
        for params in expand(config, count=count, seed=seed):
            trial = make(config, params, gpus)
            trials.setdefault(trial.run_dir.resolve(), trial)  # `runs` and `$PWD/runs` are one directory
    return list(trials.values())


def swept_keys(trials: list[Trial]) -> list[str]:
    """The parameters whose values tell the trials apart (compared in normal form)."""
    first = trials[0].params if trials else {}
    return [k for k in first if len({json.dumps(normalize(t.params.get(k))) for t in trials}) > 1]


def find_record(trial: Trial) -> dict | None:
    """The trial's record: {run_dir}/results.json when it says it belongs to this trial, else None."""
    record, _ = load_record(trial.run_dir)  # None: not started, or unreadable
    return {**record, "_path": str(trial.run_dir / RECORD)} if record and record.get("trial") == trial.id else None


SOURCE_KEY = "model.init_from"  # a trial started from another run names that run's directory here


def missing_sources(all_trials: list[Trial], options: str = "") -> str | None:
    """One line naming the source runs (model.init_from run directories) without a finished record and the
    sweeps that make them; None when every source has finished. `options`: added to each command."""
    from vit_lightning.run.transfer import source_kind, source_problem  # torch and Lightning: only for a transfer sweep

    missing: dict[tuple[str, str], list[str]] = {}
    for trial in all_trials:
        source = trial.params.get(SOURCE_KEY)
        if not source or source_kind(str(source)) != "run":
            continue
        if source_problem(str(source)):  # fit's own rule: a checkpoint, and a record that says completed
            path = Path(str(source))
            missing.setdefault((path.parent.parent.name, path.parent.name), []).append(path.name)
    if not missing:
        return None
    count = sum(map(len, missing.values()))
    where = "; ".join(f"{a}/{p}: {', '.join(names)}" for (a, p), names in missing.items())
    make = " && ".join(f"vit-ablate sweep {a} --profile {p}{options}" for a, p in missing)
    return f"{count} source run(s) have not finished ({where}); make them first: {make}"



def profiles_of(all_trials: list[Trial], directory: Path | None = None) -> dict[tuple, Any]:
    """(run.ablation, run.profile) -> its Profile, for every pair the trials name (None: not an ablation here)."""
    from vit_lightning.ablation import load

    out: dict[tuple, Any] = {}
    for trial in all_trials:
        names = (trial.params.get("run.ablation"), trial.params.get("run.profile"))
        if names not in out:
            try:
                out[names] = load(names[0], directory).profile(names[1])
            except (ValueError, KeyError, FileNotFoundError, TypeError):
                out[names] = None  # a sweep file of an ablation not here: nothing declared
    return out


def with_evaluations(all_trials: list[Trial], directory: Path | None = None) -> list[Trial]:
    """The trials, each with the evaluations its profile (run.ablation, run.profile) declares for its cell."""
    profiles = profiles_of(all_trials, directory)
    out = []
    for trial in all_trials:
        prof = profiles[(trial.params.get("run.ablation"), trial.params.get("run.profile"))]
        declared = prof.evaluations if prof is not None else None
        out.append(replace(trial, evaluations=tuple(declared.commands(str(trial.run_dir), trial.params)))
                   if declared else trial)
    return out
