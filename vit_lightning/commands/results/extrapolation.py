"""The extrapolation view: each run evaluated on larger canvases at a fixed content scale, against the factor.

`vit-ablate eval RUN --data.img_size=N --into-record` on a canvas (the tokens view, `<data>@<N>px/tokens`, or
`/canvas` before the views were named; the default grid rules) stores top-1 and the attention read-outs (per block
mean entropy and distance in tokens, `attn/...`). The factor is the canvas side over the side trained at (tokens
per side over trained tokens per side). Figures: accuracy against the factor (a panel per task, a line per cell,
seed bands), and the read-outs against it; a sentence says, per cell, whether a fall coincides with entropy drift
(attention spreading towards uniform, or collapsing).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.style
import numpy as np
from matplotlib.figure import Figure

from vit_lightning.core.evalkey import parse
from vit_lightning.core.plotstyle import STYLE, save_png
from vit_lightning.records.shapes import Data, cell_name, fmt_value, label

SIZE, TASK = "model.img_size", "data.task"
# how a task's answer moves on a larger canvas, for its panel and columns
CANVAS_NOTES = {"absolute": "quadrants scale with the canvas"}
FALL, DRIFT = 0.05, 0.05  # a fall in accuracy, and a drift in entropy as a share of uniform's log T, worth a word


def canvas_points(record: dict, rules: str = "") -> dict[float, dict[str, float]]:
    """factor -> {acc, entropy, distance, tokens} of one record: its own val/acc at 1, each canvas evaluation at the
    grid rules `rules` (evalkey.py: '' the defaults, '/keep', '/rope-ntk', ...) at its side over the trained side (the
    read-outs where eval stored them; on the trained grid every rule is the default)."""
    config, out = record.get("config") or {}, {}
    size = config.get(SIZE)
    if not isinstance(size, int):
        return {}
    if (own := (record.get("metrics") or {}).get("val/acc")) is not None:
        out[1.0] = {"acc": own}
    for key, metrics in (record.get("eval") or {}).items():
        measured = parse(key)  # the run's own task and scale on a canvas, at the default grid rules only
        if not (measured and measured.view in ("tokens", "native") and measured.of_run(config)
                and (measured.view == "tokens" or not measured.earlier)) or not isinstance(metrics, dict):
            continue
        if measured.rules != rules and not (measured.rules == "" and measured.img_size == size):
            continue
        point = out.setdefault(measured.img_size / size, {})
        for field, name in (("acc", "val/acc"), ("entropy", "attn/entropy"), ("distance", "attn/distance"),
                            ("tokens", "attn/tokens")):
            if metrics.get(name) is not None:
                point.setdefault(field, float(metrics[name]))  # at factor 1 the run's own val/acc stands
    return out


def rules_of(record: dict) -> list[str]:
    """The grid rules of a record's evaluations ('' the defaults, first), as evalkey writes them."""
    found = {measured.rules for key in (record.get("eval") or {}) if (measured := parse(key))}
    return [""] + sorted(found - {""})


def cell_curves(data: Data) -> dict[tuple[int, str], dict[float, dict[str, list[float]]]]:
    """(cell, grid rules) -> factor -> field -> the values of its runs (finished runs only): a curve per cell and per
    rule it was evaluated with."""
    used = data.runs[data.runs["note"] == ""] if "note" in data.runs else data.runs
    out: dict = {}
    for cell, name in zip(used["cell"], used["name"]):
        record = data.records.get(name, {})
        for rules in rules_of(record):
            for factor, point in canvas_points(record, rules).items():
                for field, value in point.items():
                    out.setdefault((cell, rules), {}).setdefault(factor, {}).setdefault(field, []).append(value)
    return {c: f for c, f in out.items() if len(f) > 1}


def curve_name(data: Data, cell: int, rules: str, keys: list[str]) -> str:
    """A curve's name: its cell's, and the grid rules it was evaluated with where not the defaults."""
    return cell_name(data.cells.loc[cell], keys) + (f" ({rules.strip('/').replace('/', ', ')})" if rules else "")


def normalised_entropy(entropy: float, tokens: float) -> float:
    """Entropy as a share of uniform attention's, log T: comparable across canvases with different token counts."""
    return entropy / math.log(tokens) if tokens > 1 else float("nan")


def fall_with_drift(acc: tuple[float, float], entropy: tuple[float, float]) -> str:
    """'holds', 'falls with entropy drift' or 'falls without entropy drift' (without read-outs 'falls': drift_line
    says once that it cannot tell), from (trained, largest) accuracy and normalised entropy: a fall of more than FALL,
    a drift of more than DRIFT either way."""
    if acc[0] - acc[1] <= FALL:
        return "holds"
    if any(math.isnan(e) for e in entropy):
        return "falls"
    return "falls with entropy drift" if abs(entropy[1] - entropy[0]) > DRIFT else "falls without entropy drift"


def drift_line(data: Data) -> str:
    """One sentence: per cell with canvases, whether it holds or falls by the largest factor and whether the fall
    coincides with entropy drift; '' without canvas evaluations."""
    keys = [k for k in data.profile.axes if k != data.ablation.panel]
    found = []  # (verdict, name, accuracies, largest factor, drift)
    for (cell, rules), curve in sorted(cell_curves(data).items()):
        factors = sorted(curve)
        last = factors[-1]
        acc = tuple(float(np.mean(curve[f].get("acc", [np.nan]))) for f in (factors[0], last))
        read = [f for f in factors if "entropy" in curve[f] and "tokens" in curve[f]]
        ent = (tuple(float(np.mean([normalised_entropy(e, t) for e, t in zip(curve[f]["entropy"], curve[f]["tokens"])]))
                     for f in (read[0], read[-1])) if len(read) > 1 else (math.nan, math.nan))
        drift = "" if math.isnan(ent[0]) else f", entropy {ent[0]:.2f} -> {ent[1]:.2f} of uniform"
        found.append((fall_with_drift(acc, ent), curve_name(data, cell, rules, keys), acc, last, drift))
    if not found:
        return ""
    one = len({last for *_, last, _ in found}) == 1  # one largest factor: said once, not per cell
    parts = [f"{verdict}: " + ", ".join(f"{name} ({acc[0]:.3f} -> {acc[1]:.3f}{'' if one else f' at {last:.3g}x'}{drift})"
                                         for v, name, acc, last, drift in found if v == verdict)
             for verdict in dict.fromkeys(v for v, *_ in found)]
    unread = " (no attention read-outs: whether a fall coincides with entropy drift cannot be told)" if any(
        v == "falls" for v, *_ in found) else ""
    head = f"larger canvases (content at its own scale{f'; trained -> {found[0][3]:.3g}x' if one else ''}): "
    return head + "; ".join(parts) + unread


def _panel_title(data: Data, value) -> str:
    key = data.ablation.panel
    note = CANVAS_NOTES.get(value) if key == TASK else None
    return f"{label(key)}={fmt_value(value)}" + (f" ({note})" if note else "") if key else ""


def _draw(data: Data, path: Path, fields: list[tuple[str, str]]) -> Path:
    """Rows of `fields` (field, y label) x a column per panel value; a line per cell with its seed band."""
    curves, key = cell_curves(data), data.ablation.panel
    values = list(dict.fromkeys(data.cells[key])) if key else [None]
    names = [k for k in data.profile.axes if k != key]
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(4.2 * len(values), 3.2 * len(fields)))
        axes = fig.subplots(len(fields), len(values), squeeze=False)
        for col, value in enumerate(values):
            for row, (field, ylabel) in enumerate(fields):
                ax = axes[row][col]
                for (cell, rules), curve in sorted(curves.items()):
                    if key and data.cells.at[cell, key] != value:
                        continue
                    xs = [f for f in sorted(curve) if field in curve[f]]
                    if len(xs) < 2:
                        continue
                    mean = np.array([np.mean(curve[f][field]) for f in xs])
                    std = np.array([np.std(curve[f][field], ddof=1) if len(curve[f][field]) > 1 else 0.0 for f in xs])
                    line = ax.plot(xs, mean, "o-" if not rules else "s--", ms=3,
                                   label=curve_name(data, cell, rules, names))[0]
                    ax.fill_between(xs, mean - std, mean + std, alpha=0.2, color=line.get_color())
                ax.set_xscale("log")
                ax.set(xlabel="canvas side / trained side", ylabel=ylabel, title=_panel_title(data, value))
                if ax.lines:
                    ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        return save_png(fig, path)


def figures(data: Data) -> list[tuple]:
    """(png, caption, draw) for the accuracy and read-out curves; [] without canvas evaluations."""
    curves = cell_curves(data)
    if not curves:
        return []
    out = [("extrapolation.png", "top-1 against the canvas factor (content at its own scale; mean and seed std)",
            lambda p: _draw(data, p, [("acc", "top-1")]))]
    if any("entropy" in point for curve in curves.values() for point in curve.values()):
        out.append(("attention_readouts.png", "mean attention entropy (nats) and distance (tokens) against the canvas "
                    "factor, mean over blocks", lambda p: _draw(data, p, [("entropy", "entropy (nats)"),
                                                                          ("distance", "distance (tokens)")])))
    return out
