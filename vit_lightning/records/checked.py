"""The one loader's checks: every stored record is read through `checked` before any table or figure sees it.

A record is JSON written by a run, copied by hand or fetched from W&B, so any field may hold anything. What a
table reads must be what it expects: a metric a finite number (or None: missing), an image size a whole number,
an `eval` entry a mapping of metrics, a history a list of epochs. A malformed or non-finite entry is dropped with
one line naming the file and the key (the run's other numbers are kept), and listed with the run under "Runs not
averaged"; a record without a name is skipped whole.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vit_lightning.run.record import SCHEMA

SKIPPED = "_skipped"  # the entries dropped from a record, as "key: why" (for "Runs not averaged")
COMPUTE_NUMBERS = ("params", "gflops_per_image", "train_images_per_s", "wall_s")
SIZE = "model.img_size"


def finite(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _what(value: Any) -> str:
    if isinstance(value, float):
        return f"{value!r} is not a finite number"
    return f"{value!r} is not a number" if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"


def _numbers(tree: dict, where: str, keys=None) -> tuple[dict, list[str]]:
    """tree with every value (of `keys`, default all) that is neither None nor a finite number dropped; the drops."""
    kept, problems = {}, []
    for key, value in tree.items():
        if (keys is None or key in keys) and value is not None and not finite(value):
            problems.append(f"{where}[{key!r}]: {_what(value)}")
            continue
        kept[key] = value
    return kept, problems


def _mapping(record: dict, key: str, problems: list[str]) -> dict:
    value = record.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key}: {_what(value)}, not a mapping")
        return {}
    return value


def _evals(evals: dict, problems: list[str]) -> dict:
    out = {}
    for key, entry in evals.items():
        if not isinstance(entry, dict):
            problems.append(f"eval[{key!r}]: {_what(entry)}, not a mapping of metrics")
            continue
        out[key], dropped = _numbers(entry, f"eval[{key!r}]")
        problems += dropped
    return out


def _history(history: Any, problems: list[str]) -> list[dict]:
    if history is None:
        return []
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        problems.append(f"history: {_what(history)}, not a list of epochs")
        return []
    out = []
    for k, epoch in enumerate(history):
        kept, dropped = _numbers(epoch, f"history[{k}]")
        out.append(kept)
        problems += dropped
    return out


def _config(config: dict, problems: list[str]) -> dict:
    size = config.get(SIZE)
    whole = isinstance(size, int) and not isinstance(size, bool) and size > 0
    pair = isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)
    if size is not None and not (whole or pair):
        problems.append(f"config[{SIZE!r}]: {size!r} is not an image size in pixels")
        return {k: v for k, v in config.items() if k != SIZE}
    return config


def checked(record: dict, path: Path, warn) -> dict | None:
    """The record with every malformed or non-finite entry dropped (each named by `warn` in one line, and kept
    under SKIPPED); None, after one line, when it has no name to list it by."""
    if not isinstance(record.get("name"), str) or not record["name"]:
        warn(f"{path}: 'name': {_what(record.get('name'))}; skipped (not a run record)")
        return None
    problems: list[str] = []
    out = dict(record)
    out["config"] = _config(_mapping(record, "config", problems), problems)
    out["metrics"], dropped = _numbers(_mapping(record, "metrics", problems), "metrics")
    problems += dropped
    out["compute"], dropped = _numbers(_mapping(record, "compute", problems), "compute", COMPUTE_NUMBERS)
    problems += dropped
    out["eval"] = _evals(_mapping(record, "eval", problems), problems)
    out["history"] = _history(record.get("history"), problems)
    if record.get("schema", SCHEMA) != SCHEMA:  # another layout: its fields may mean something else (none: by hand)
        problems.append(f"schema: {record.get('schema')!r} is not the record schema this version reads ({SCHEMA})")
    if not isinstance(record.get("status"), str):
        problems.append(f"status: {_what(record.get('status'))}")
        out["status"] = "unknown"
    for problem in problems:
        warn(f"{path}: {problem}; the run is not averaged (listed under 'Runs not averaged')")
    out[SKIPPED] = problems
    return out
