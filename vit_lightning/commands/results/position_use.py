"""What the position-use sentence says beside each cell's shuffle drop: the weights both numbers come from, the token
grid an ignored encoding was tested at, the attention bias it could give there, and each encoding's own caveat."""

from __future__ import annotations

import math

import pandas as pd

from vit_lightning.core.names import BEST_METRIC
from vit_lightning.model.position import LARGEST_BIAS, shuffle_caveat
from vit_lightning.records.shapes import Data, join

FINAL = "val/acc"  # the final epoch's top-1: the record's last history entry, the weights the shuffle is measured on


def _used(data: Data, index: int) -> pd.DataFrame:
    runs = data.runs
    return runs[(runs["note"] == "") & (runs["cell"] == index)]


def weights_note(data: Data) -> str:
    """Which weights the drop and the accuracy column come from, and how far apart they are in these runs."""
    metric = data.ablation.metric
    drop = "both top-1s of the final weights"
    if metric == FINAL:
        return f"{drop}, as the accuracy column ({FINAL})"
    if metric != BEST_METRIC:
        return f"{drop}; the accuracy column is {metric}"
    runs = data.runs[data.runs["note"] == ""]
    pairs = [(b, f) for b, f in zip(pd.to_numeric(runs[metric], errors="coerce"),
                                    pd.to_numeric(runs[FINAL], errors="coerce")) if math.isfinite(b) and math.isfinite(f)]
    text = f"{drop}; the accuracy column is the best epoch's ({metric})"
    if not pairs:
        return text
    last = sum(b == f for b, f in pairs)
    gap = max(b - f for b, f in pairs)
    return (text + f", the final epoch in {last} of {len(pairs)} runs"
            + (f", elsewhere at most {gap:.4f} above the final weights' ({FINAL})" if last < len(pairs) else ""))


def grid(data: Data, indices: list[int]) -> str | None:
    """'4x4' (the token grid the cells' runs were trained at: image over patch size), 'AxB or CxD' when they differ."""
    found = []
    for index in indices:
        for name in _used(data, index)["name"]:
            config = (data.records.get(name) or {}).get("config") or {}
            size, patch = config.get("model.img_size"), config.get("model.patch_size")
            sides = size if isinstance(size, (list, tuple)) else [size, size]
            if patch and all(isinstance(s, int) for s in sides):
                found.append(f"{sides[0] // patch}x{sides[1] // patch}")
    found = list(dict.fromkeys(found))
    return " or ".join(found) if found else None


def largest_bias(data: Data, index: int) -> str:
    """'; largest bias per head 1.06, 0.27 logits' from the cell's records that store it (at fit), else ''."""
    biases = [facts[LARGEST_BIAS] for name in _used(data, index)["name"]
              if LARGEST_BIAS in (facts := (data.records.get(name) or {}).get("compute") or {})]
    if not biases:
        return ""
    heads = [max(b[h] for b in biases) for h in range(min(map(len, biases)))]  # alike across seeds: one grid
    return f"; largest bias per head {', '.join(f'{b:.2f}' for b in heads)} logits"


def caveats(data: Data, indices: list[int], names: dict[int, str]) -> list[str]:
    """Each cell's encoding's caveat on what its shuffle drop measures (model/position.py), once per text."""
    found: dict[str, list[str]] = {}
    for index in indices:
        for name in _used(data, index)["name"]:
            config = (data.records.get(name) or {}).get("config") or {}
            model = {k.removeprefix("model."): v for k, v in config.items() if k.startswith("model.")}
            if text := shuffle_caveat(model):
                found.setdefault(text, [])
                if names[index] not in found[text]:
                    found[text].append(names[index])
    return [f"{join(cells)}: {text}" for text, cells in found.items()]
