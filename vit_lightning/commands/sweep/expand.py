"""Expand a W&B sweep config into trials the way W&B's grid and random search do.

Semantics follow the wandb/sweeps library: parameters are taken in sorted name order; a
parameter's distribution is inferred from its fields when not named (`value` -> constant,
`values` -> categorical, int `min`/`max` -> int_uniform, else uniform); grid search allows
constant, categorical, int_uniform (min..max inclusive) and q_uniform (min, min+q, ... < max),
takes their cartesian product and skips duplicate configs; random search samples every
parameter independently per run; `run_cap` caps the number of runs.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

from vit_lightning.core.identity import normalize

SWEEP_KEYS = {
    "apiVersion", "kind", "controller", "description", "program", "job", "image_uri", "entity", "project",
    "method", "command", "name", "run_cap", "metric", "metrics", "scheduler", "early_terminate", "parameters",
}
METHODS = ("grid", "random", "bayes", "custom")
# distribution -> (required fields, optional fields with defaults)
DISTRIBUTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "constant": (("value",), {}),
    "categorical": (("values",), {}),
    "categorical_w_probabilities": (("values", "probabilities"), {}),
    "int_uniform": (("min", "max"), {}),
    "uniform": (("min", "max"), {}),
    "q_uniform": (("min", "max"), {"q": 1.0}),
    "log_uniform": (("min", "max"), {}),
    "log_uniform_values": (("min", "max"), {}),
    "q_log_uniform": (("min", "max"), {"q": 1.0}),
    "q_log_uniform_values": (("min", "max"), {"q": 1.0}),
    "normal": ((), {"mu": 0.0, "sigma": 1.0}),
    "q_normal": ((), {"mu": 0.0, "sigma": 1.0, "q": 1.0}),
    "log_normal": ((), {"mu": 0.0, "sigma": 1.0}),
    "q_log_normal": ((), {"mu": 0.0, "sigma": 1.0, "q": 1.0}),
    "beta": ((), {"a": 1.0, "b": 1.0}),
    "q_beta": ((), {"a": 1.0, "b": 1.0, "q": 1.0}),
}
GRID_DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "q_uniform")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def distribution(name: str, spec) -> tuple[str, dict]:
    """(distribution, spec with defaults filled) for one parameter; ValueError on a malformed spec."""
    if not isinstance(spec, dict):
        raise ValueError(f"parameter {name}: expected a mapping with value/values/distribution, got {spec!r}")
    if "parameters" in spec:
        raise ValueError(f"parameter {name}: nested parameters are not supported; use flat dotted keys")
    dist = spec.get("distribution")
    if dist is None:
        if "value" in spec:
            dist = "constant"
        elif "values" in spec:
            dist = "categorical_w_probabilities" if "probabilities" in spec else "categorical"
        elif "min" in spec and "max" in spec:
            dist = "int_uniform" if _is_int(spec["min"]) and _is_int(spec["max"]) else "uniform"
        else:
            raise ValueError(f"parameter {name}: needs value, values, min/max or a distribution")
    if dist == "categorical" and "probabilities" in spec:
        dist = "categorical_w_probabilities"
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"parameter {name}: unknown distribution {dist!r}; choose from {', '.join(DISTRIBUTIONS)}")
    required, optional = DISTRIBUTIONS[dist]
    fields = set(spec) - {"distribution"}
    if missing := [f for f in required if f not in spec]:
        raise ValueError(f"parameter {name}: distribution {dist} needs {', '.join(missing)}")
    if extra := sorted(fields - set(required) - set(optional)):
        allowed = ", ".join(("distribution",) + required + tuple(optional))
        raise ValueError(f"parameter {name}: unknown field {extra[0]!r} for {dist}; allowed: {allowed}")
    out = {**optional, **{k: v for k, v in spec.items() if k != "distribution"}}
    _check_fields(name, dist, out)
    return dist, out


def _check_fields(name: str, dist: str, spec: dict) -> None:
    """Types and bounds of one parameter's fields."""
    if "values" in spec and (not isinstance(spec["values"], list) or not spec["values"]):
        raise ValueError(f"parameter {name}: values must be a non-empty list")
    if dist == "categorical_w_probabilities":
        probs = spec["probabilities"]
        if not isinstance(probs, list) or len(probs) != len(spec["values"]) or not all(_is_num(p) and p >= 0 for p in probs):
            raise ValueError(f"parameter {name}: probabilities must be one non-negative number per value")
    if "min" in spec:
        lo, hi = spec["min"], spec["max"]
        if not (_is_num(lo) and _is_num(hi)) or (dist == "int_uniform" and not (_is_int(lo) and _is_int(hi))):
            raise ValueError(f"parameter {name}: min and max must be {'integers' if dist == 'int_uniform' else 'numbers'}")
        if lo >= hi:
            raise ValueError(f"parameter {name}: min {lo} is not less than max {hi}")
        if dist.endswith("_values") and lo <= 0:
            raise ValueError(f"parameter {name}: {dist} needs min > 0, got {lo}")
    for f in ("q", "sigma", "a", "b"):
        if f in spec and not (_is_num(spec[f]) and spec[f] > 0):
            raise ValueError(f"parameter {name}: {f} must be a positive number, got {spec[f]!r}")


def _quantize(x: float, q) -> float | int:
    """Round to a multiple of q, as an int when q is an int."""
    value = round(x / q) * q
    return int(value) if _is_int(q) else value


def sample(dist: str, spec: dict, rng: random.Random) -> Any:
    """One random draw of a parameter."""
    if dist == "constant":
        return spec["value"]
    if dist == "categorical":
        return spec["values"][rng.randrange(len(spec["values"]))]
    if dist == "categorical_w_probabilities":
        return rng.choices(spec["values"], weights=spec["probabilities"])[0]
    if dist == "int_uniform":
        return rng.randint(spec["min"], spec["max"])
    if dist in ("normal", "q_normal", "log_normal", "q_log_normal"):
        x = rng.gauss(spec["mu"], spec["sigma"])
        x = math.exp(x) if "log" in dist else x
    elif dist in ("beta", "q_beta"):
        x = rng.betavariate(spec["a"], spec["b"])
    else:
        lo, hi = spec["min"], spec["max"]
        if dist.endswith("_values"):  # bounds are values; sample uniformly in log space
            lo, hi = math.log(lo), math.log(hi)
        x = rng.uniform(lo, hi)
        x = math.exp(x) if "log" in dist else x
    return _quantize(x, spec["q"]) if dist.startswith("q_") else x


def grid_values(name: str, dist: str, spec: dict) -> list:
    """The values a grid search enumerates for one parameter."""
    if dist == "constant":
        return [spec["value"]]
    if dist == "categorical":
        return list(spec["values"])
    if dist == "int_uniform":
        return list(range(spec["min"], spec["max"] + 1))
    if dist == "q_uniform":  # like numpy.arange(min, max, q): max itself is excluded
        n = math.ceil((spec["max"] - spec["min"]) / spec["q"])
        return [spec["min"] + i * spec["q"] for i in range(n)]
    raise ValueError(
        f"parameter {name}: distribution {dist} is not allowed with method grid; "
        f"grid needs {', '.join(GRID_DISTRIBUTIONS)}"
    )


def parameters(config: dict) -> dict[str, tuple[str, dict]]:
    """Sorted name -> (distribution, spec) for the sweep's parameters."""
    params = config.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ValueError("sweep needs a non-empty 'parameters' mapping")
    return {name: distribution(name, params[name]) for name in sorted(params)}


def expand(config: dict, count: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The trials (name -> value) a W&B controller would hand out, capped by run_cap and count."""
    method = config.get("method")
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if method == "custom":
        raise ValueError("method custom needs the W&B server: use --backend wandb (local runs grid, random and bayes)")
    if method == "bayes":
        raise ValueError("method bayes proposes its trials one at a time from the results (sweep/search.py)")
    params = parameters(config)
    caps = [c for c in (config.get("run_cap"), count) if c is not None]
    cap = min(caps) if caps else None
    if method == "grid":
        names = list(params)
        axes = [grid_values(n, *params[n]) for n in names]
        trials, seen = [], set()
        for combo in itertools.product(*axes):
            trial = dict(zip(names, combo))
            if (key := json.dumps(normalize(trial), sort_keys=True)) not in seen:  # 1 and 1.0 are one value
                seen.add(key)
                trials.append(trial)
        return trials[:cap] if cap is not None else trials
    if cap is None:
        raise ValueError("method random runs forever on W&B; give run_cap in the sweep or --count N")
    rng = random.Random(seed)
    return [{n: sample(d, s, rng) for n, (d, s) in params.items()} for _ in range(cap)]


def render_args(trial: dict[str, Any]) -> list[str]:
    """`${args}` exactly as the W&B agent renders it: --key=str(value), keys in sweep order."""
    return [f"--{key}={value}" for key, value in trial.items()]
