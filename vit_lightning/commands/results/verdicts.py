"""The verdict grid that opens every table: each cell against each question in one word or three (answers, at
chance, equivalent, not settled, ...), with the verdict the ablation expected beside it where it states one."""

from __future__ import annotations

import math
from typing import Any

from scipy import stats

from vit_lightning.records.render import Table
from vit_lightning.records.stats import ALPHA, Comparison, fmt_p

CAPTION = "Verdicts"
RISING = "not settled (still rising)"  # a cell whose accuracy still rose at the end of its budget (settle.py)


def versus(comp: Any, ref: str, means: tuple[float, float], margin: float, chance: float | None) -> str:
    """One cell's answer to 'does it differ from ref?': comp is its Comparison, or ref's role ('baseline', 'best')."""
    if isinstance(comp, str):  # the reference itself
        return {"best": "the best"}.get(comp, comp) + _level(means[1], means[1], margin, chance, alone=True)
    if not isinstance(comp, Comparison) or comp.n == 0:
        return "no runs"
    if comp.holm is None:
        return "not settled (n<2)"
    if comp.equivalent:
        return "equivalent" + (_level(*means, margin, chance) or f" to {ref}")
    if comp.outcome == "higher":
        return "answers" if chance is not None else f"beats {ref}"
    if comp.outcome == "lower":
        return f"below {ref}"
    return f"not settled (Holm p {fmt_p(comp.holm)})"


def _level(mine: float, theirs: float, margin: float, chance: float | None, alone: bool = False) -> str:
    """': both at chance' / ': both saturated' when both means sit within the margin of the floor or the ceiling."""
    if margin <= 0 or math.isnan(mine) or math.isnan(theirs):
        return ""
    if chance is not None and abs(mine - chance) < margin and abs(theirs - chance) < margin:
        return ", at chance" if alone else ": both at chance"
    if mine > 1 - margin and theirs > 1 - margin:
        return ", saturated" if alone else ": both saturated"
    return ""


def grid(rows: list[str], columns: list[tuple[str, dict[str, str]]]) -> Table:
    """Rows (cell names) x columns (question title, {cell name: verdict}); '-' where a cell was not asked."""
    return Table(CAPTION, ["cell", *(title for title, _ in columns)],
                 [[row, *(answers.get(row, "-") for _, answers in columns)] for row in rows])


def passing_std(margin: float, n: int) -> float:
    """The largest seed std (the same on both sides, equal means) at which TOST within +-margin passes at n runs a
    side, one-sided alpha before Holm: margin / (t_{1-alpha, 2(n-1)} * sqrt(2/n))."""
    return margin / (stats.t.ppf(1 - ALPHA, 2 * (n - 1)) * math.sqrt(2 / n)) if n >= 2 else 0.0


def margin_note(margin: float, why: str, stds: dict[str, tuple[float, int]]) -> str | None:
    """What the equivalence margin can show at each cell's n, which cells' seed noise rules it out, and why the
    margin is what it is; stds: cell name -> (seed std, n)."""
    if margin <= 0:
        return None
    ns = sorted({n for _, n in stds.values() if n >= 2})
    bounds = ", ".join(f"{passing_std(margin, n):.4f} at n={n}" for n in ns) or "none (no cell has two runs)"
    noisy = [f"{name} ({std:.4f})" for name, (std, n) in stds.items() if n >= 2 and std >= passing_std(margin, n)]
    return (f"'equivalent' (within ±{margin:g}) can pass only where both cells' seed std is below {bounds} (equal "
            f"means, one-sided α={ALPHA:g} before Holm); " + (f"too noisy for it here: {', '.join(noisy)}; " if noisy
                                                             else "") + f"the margin: {why or 'the ablation states no reason'}")
