"""A run's identity: config values normalised once, the run's name, and where its record lives.

`fit` names its run directory with the id the sweep runner hands it (`--run.trial`), else with
`model.family.trial_name` of the parameters a W&B agent gave it, else of its resolved config; the runner's id is
`trial_name` of the trial's parameters, so a trial has one name under either backend (model/naming.py says
which options a name shows; this module makes the hash). The name
includes the number of processes the run trains on (`world_size`): the global batch changes with
it, so `--gpus-per-agent 2` and `4` are different runs. The runner then finds a trial's record by
that id, and the tables compare designed and recorded values with `same`, so both read "1e-4",
0.0001 and the 0.0001 fit parsed as one value.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from vit_lightning.core.names import RUN_DEFAULTS

# Keys that do not change what is trained: bookkeeping (already in the path), display switches, compilation (the
# same model, computed faster: a run may resume with it toggled) and where augmentation and decoding run (the same
# draws).
NOT_IDENTITY = ("run.", "trainer.enable_progress_bar", "trainer.enable_model_summary", "model.compile",
                "data.augment_on", "data.decode_on")
TRIAL_KEY = "run.trial"  # fit's option for the id the sweep runner hands each trial
WORLD_KEY = "world_size"  # hashed with a run's values when it trains on more than one process
TRIAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one path component, never "..", never hidden, never absolute
INT = re.compile(r"[-+]?[0-9]+")
FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?")
BOOLS = {"true": True, "false": False}


def plain(value: Any) -> Any:
    """A value as strict JSON holds it: tuples as lists, str keys, non-finite floats as None, objects as str."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def normalize(value: Any) -> Any:
    """The one comparable form of a config value: "1e-4" -> 0.0001, "2" -> 2, "true" -> True, 3.0 -> 3."""
    value = plain(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in BOOLS:
            return BOOLS[text.lower()]
        value = int(text) if INT.fullmatch(text) else plain(float(text)) if FLOAT.fullmatch(text) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # W&B dedupes 3e6 and 3000000 alike; `fit` parses `--model.lr=1` as 1.0
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    return value


def same(want: Any, have: Any) -> bool:
    """A designed (or swept) value equals a recorded one, compared in normal form."""
    return normalize(want) == normalize(have)


def number(value: Any) -> float | None:
    """A metric as a float (tensors, "NaN" and "Infinity" included); None when it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat dotted keys with plain values.

    A class given as {class_path, init_args} (a callback, a logger) stays one value; W&B's raw
    {value, desc} wrappers are unwrapped and its internal `_keys` dropped.
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if str(key).startswith("_"):
            continue
        if isinstance(value, dict) and "value" in value and set(value) <= {"value", "desc"}:
            value = value["value"]
        if isinstance(value, dict) and value and "class_path" not in value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = plain(value)
    return flat


def world_size(config: dict[str, Any], gpus: int) -> int:
    """Processes a run trains on: trainer.num_nodes x its devices, `auto` (and -1) read as Lightning reads them.

    `gpus` is the number of GPUs the run will see (its CUDA_VISIBLE_DEVICES group); `auto` on a CPU is one process.
    """
    devices, accelerator = normalize(config.get("trainer.devices", "auto")), config.get("trainer.accelerator", "auto")
    on_gpus = accelerator in ("gpu", "cuda") or (accelerator == "auto" and gpus > 0)
    if devices in ("auto", -1):
        count = gpus if on_gpus else 1
    elif isinstance(devices, list):
        count = len(devices)
    elif isinstance(devices, str):  # "0,1": these GPU ids
        count = len([d for d in devices.split(",") if d.strip()])
    else:
        count = int(devices)
    return max(1, count) * int(normalize(config.get("trainer.num_nodes")) or 1)


def named_values(params: dict[str, Any], world: int = 1, neutral: dict | None = None) -> dict[str, Any]:
    """The values a name is made of: normalised, without bookkeeping, without `neutral` options at their values
    (options added after runs were named), with the world size beyond one process (the global batch)."""
    neutral = neutral or {}
    values = {k: normalize(v) for k, v in params.items() if not k.startswith(NOT_IDENTITY)}
    values = {k: v for k, v in values.items() if k not in neutral or v != neutral[k]}
    if world != 1:
        values[WORLD_KEY] = world
    return values


def digest(values: dict[str, Any], defaults: dict | None = None) -> str:
    """The hash of a name: every value, or (`defaults`: an ad hoc fit's parser defaults) those away from them, so an
    option added later with a default renames nothing; a sweep trial hashes every parameter it was given."""
    hashed = values if defaults is None else {
        k: v for k, v in values.items() if k not in defaults or v != normalize(defaults[k])}
    return hashlib.sha1(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:8]


def compose(texts: list[str | None], world: int, hashed: str) -> str:
    """A run name from its readable parts (None: absent), the world size beyond one process and its hash."""
    name = "-".join(str(p) for p in [*texts, f"w{world}" if world != 1 else None, hashed] if p is not None)
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def run_dir(config: dict[str, Any]) -> Path:
    """{run.root}/{run.ablation}/{run.profile}/{run.trial} (model.family.trial_name names a trial)."""
    get = lambda key: str(config.get(key) or RUN_DEFAULTS[key])  # noqa: E731
    for key in ("run.ablation", "run.profile", TRIAL_KEY):  # each one folder below run.root, never outside it
        value = config.get(key)
        if value is not None and not TRIAL_NAME.fullmatch(str(value)):
            raise ValueError(f"{key}={value!r} must be one plain name of letters, digits, '.', '_' and '-'")
    if not config.get(TRIAL_KEY):
        raise ValueError(f"{TRIAL_KEY} is not set: a run folder is named by its trial's name")
    return Path(get("run.root")) / get("run.ablation") / get("run.profile") / str(config[TRIAL_KEY])
