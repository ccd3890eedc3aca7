"""Whether a profile's budget settled: epochs to a level per cell, cells still rising, and the learning curves.

A cell whose accuracy still rose by more than RISE over its last two epochs is flagged, not ranked: its budget
ended before it did (the verdict grid says "not settled (still rising)" for it). A profile asks for these with
`settle=True` (ablation.Profile).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from vit_lightning.records.render import Table
from vit_lightning.records.shapes import Data, cell_name, fmt_num

LEVEL, RISE = 0.9, 0.02  # the accuracy whose epoch the table gives; the rise over the last two epochs that flags


def accuracies(history: list[dict]) -> list[float]:
    """val/acc per validated epoch, in order (epochs without one left out)."""
    return [float(h["val/acc"]) for h in history if h.get("val/acc") is not None]


def epochs_to(history: list[dict], level: float = LEVEL) -> int | None:
    """The number of epochs trained when val/acc first reached `level`, or None if it never did."""
    return next((i + 1 for i, acc in enumerate(accuracies(history)) if acc >= level), None)


def last_rise(history: list[dict]) -> float | None:
    """val/acc at the last epoch minus two epochs before it (None with fewer than three epochs)."""
    accs = accuracies(history)
    return accs[-1] - accs[-3] if len(accs) >= 3 else None


def _cell_runs(data: Data, index: int) -> list[list[dict]]:
    runs = data.runs
    used = runs[(runs["note"] == "") & (runs["cell"] == index)]
    return [data.history.get(name) or [] for name in used["name"]]


def mean_rise(data: Data, index: int) -> float:
    """The mean over a cell's runs of the rise over their last two epochs (nan where no run has three epochs)."""
    rises = [r for r in (last_rise(h) for h in _cell_runs(data, index)) if r is not None]
    return float(np.mean(rises)) if rises else math.nan


def still_rising(data: Data) -> set[int]:
    """The cells (data.cells' index) whose mean rise over the last two epochs exceeds RISE: flagged, not ranked."""
    return {index for index in data.cells.index if mean_rise(data, index) > RISE}


def settling_table(data: Data) -> Table:
    """Per cell: the seeds' epochs to LEVEL (median, and how many never reached it), the mean rise over the last two
    epochs, and whether the cell is still rising."""
    keys = list(data.profile.axes)
    rows = []
    for index, cell in data.cells.iterrows():
        histories = [h for h in _cell_runs(data, index) if accuracies(h)]
        reached = [e for e in (epochs_to(h) for h in histories) if e is not None]
        rise = mean_rise(data, index)
        epochs = max((len(accuracies(h)) for h in histories), default=0)
        median = fmt_num(float(np.median(reached)) if reached else None, ".1f").replace(".0", "")
        never = len(histories) - len(reached)
        rows.append([cell_name(cell, keys), str(epochs), median + (f" ({never} of {len(histories)} never)" if never
                                                                   else ""),
                     fmt_num(rise, "+.3f"), "still rising" if rise > RISE else ("-" if math.isnan(rise) else "settled")])
    return Table(f"Budget: epochs to {LEVEL:g} and the rise over the last two epochs (> {RISE:g}: still rising, "
                 "not ranked)", ["cell", "epochs", f"epochs to {LEVEL:g} (median)", "last-two-epoch rise", "budget"],
                 rows)


def curves(data: Data) -> list[tuple[str, list[float], list[float], list[float]]]:
    """Per cell: (name, epochs, mean val/acc, seed std) over the epochs every seed of the cell reached."""
    keys, out = list(data.profile.axes), []
    for index, cell in data.cells.iterrows():
        accs = [accuracies(h) for h in _cell_runs(data, index)]
        accs = [a for a in accs if a]
        if not accs:
            continue
        length = min(map(len, accs))
        block = np.array([a[:length] for a in accs])  # (seeds, epochs)
        out.append((cell_name(cell, keys), list(range(1, length + 1)), list(block.mean(0)), list(block.std(0))))
    return out


def curve_figure(data: Data, png: str = "learning_curves.png") -> tuple[str, str, object]:
    """(png, caption, draw): validation accuracy per epoch, a line per cell with its seed band (mean +- std), one
    panel per value of the ablation's panel key."""
    caption = "Validation accuracy per epoch, mean over seeds with a band of one seed std; a panel per question"
    return png, caption, lambda path: draw_curves(Path(path), curves(data), data.ablation.title)


def draw_curves(path: Path, series: list, title: str) -> None:
    """The curves as a PNG: one panel per first part of the cell name when cells are 'row/panel/...'."""
    import matplotlib.style
    from matplotlib.figure import Figure

    from vit_lightning.core.plotstyle import STYLE, save_png

    panels: dict[str, list] = {}
    for name, x, y, err in series:
        parts = name.split("/")
        panel = parts[1] if len(parts) > 1 else ""
        panels.setdefault(panel, []).append(("/".join(p for i, p in enumerate(parts) if i != 1), x, y, err))
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(5 * max(1, len(panels)), 4.5))
        for i, (panel, lines) in enumerate(panels.items() or [("", [])]):
            ax = fig.add_subplot(1, max(1, len(panels)), i + 1)
            for label, x, y, err in lines:
                ax.plot(x, y, label=label)
                ax.fill_between(x, np.subtract(y, err), np.add(y, err), alpha=0.2)
            ax.set(xlabel="epoch", ylabel="validation accuracy", title=panel or title, ylim=(0, 1.02))
            if lines:
                ax.legend(loc="lower right", fontsize="x-small")
        fig.tight_layout()
        save_png(fig, path)


def ceiling_tables(profile) -> list[Table]:
    """The oracles' accuracies per question (profile.ceilings) as a reference table: chance is 0.25; a value above
    it is a route besides the one the question names, which a cell's accuracy must clear to show that route used."""
    if not profile.ceilings:
        return []
    rows = [[panel, oracle, f"{value:.3f}", "at chance" if value < 0.30 else "above chance"]
            for panel, found in profile.ceilings.items() for oracle, value in found.items()]
    return [Table("Reference: what each question's oracles reach without its route (data/oracles.py; chance 0.25)",
                  ["question", "oracle", "held-out accuracy", "reads"], rows)]
