"""Trials of a sweep: expanded configs, the command line the W&B agent would run, and their records."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_lightning.bookkeeping import RUN_DEFAULTS
from vit_lightning.sweep.expand import expand, render_args

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]  # W&B's default


@dataclass(frozen=True)
class Trial:
    """One run of a sweep: its parameters, `${args}` and full command line."""

    params: dict[str, Any]
    args: tuple[str, ...]
    command: tuple[str, ...]  # as the agent would run it (without the `/usr/bin/env` prefix)

    @property
    def id(self) -> str:
        """Stable id: hash of the argv, so the same trial has the same id in every sweep run."""
        return hashlib.sha1(json.dumps(self.command).encode()).hexdigest()[:12]

    @property
    def record_dir(self) -> Path:
        """runs/<ablation>/<profile>: where fit writes this trial's record."""
        get = lambda k: str(self.params.get(k, RUN_DEFAULTS[k]))  # noqa: E731
        return Path(get("run.root")) / get("run.ablation") / get("run.profile")

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
    for chunk in map(str, config.get("command") or DEFAULT_COMMAND):
        chunk = re.sub(r"\$\{envvar:([A-Z0-9_]*)\}", lambda m: os.environ.get(m.group(1), m.group(1)), chunk)
        if chunk.startswith("${") and chunk.endswith("}"):
            if chunk[2:-1] not in macros:
                supported = ", ".join("${%s}" % m for m in macros)
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


def build(configs: list[dict], count: int | None = None, seed: int = 0) -> list[Trial]:
    """Every trial of the sweeps, in order, each distinct command once."""
    trials: dict[str, Trial] = {}
    for config in configs:
        for params in expand(config, count=count, seed=seed):
            trial = Trial(params, tuple(render_args(params)), tuple(command_line(config, params)))
            trials.setdefault(trial.id, trial)
    return list(trials.values())


def _same(want: Any, have: Any) -> bool:
    """A sweep value equals a record's config value (JSON turns tuples into lists, str(x) as fit parsed it)."""
    if isinstance(want, bool) or isinstance(have, bool):
        return want == have or str(want).lower() == str(have).lower()
    if isinstance(want, str) != isinstance(have, str):  # YAML reads 1e-4 as a string; fit parsed it as a float
        want, have = _number(want), _number(have)
    if isinstance(want, (int, float)) and isinstance(have, (int, float)):
        return math.isclose(want, have, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, (list, tuple)) and isinstance(have, (list, tuple)):
        return len(want) == len(have) and all(_same(a, b) for a, b in zip(want, have))
    return want == have or str(want) == str(have)


def _number(value: Any) -> Any:
    """float(value) for numeric strings, else the value unchanged."""
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value


def find_record(trial: Trial) -> dict | None:
    """The newest record under the trial's run dir whose config has every one of the trial's values."""
    best = None
    for path in trial.record_dir.glob("*/results.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or not a record
        config = record.get("config") or {}
        if all(k in config and _same(v, config[k]) for k, v in trial.params.items()):
            if best is None or str(record.get("started_at")) > str(best.get("started_at")):
                best = {**record, "_path": str(path)}
    return best
