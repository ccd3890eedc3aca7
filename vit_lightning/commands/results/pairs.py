"""An ablation's direct pairs (Ablation.pairs): each named cell tested against the one it is paired with, beside the
grid's tests against the baseline and the best (shifted against unshifted windows, both with the same encoding)."""

from __future__ import annotations

import math

import pandas as pd

from vit_lightning.records.render import Table
from vit_lightning.records.shapes import Data, comparison_text, fmt_acc, measured, value_key
from vit_lightning.records.stats import Comparison, fmt_p, holm, welch_p


def _match(data: Data, partial: dict) -> int | None:
    """The one designed cell whose values include `partial`, else None (a profile without that cell)."""
    hits = [i for i, c in data.cells.iterrows()
            if all(k in c and value_key(c[k]) == value_key(v) for k, v in partial.items())]
    return hits[0] if len(hits) == 1 else None


def _further(data: Data, metric: str, a: int, b: int) -> list[str]:
    """[Δ, Welch p] of a further metric between two cells, from their averaged runs' values."""
    runs = data.runs[data.runs["note"] == ""]
    x, y = ([v for v in pd.to_numeric(runs[runs["cell"] == i][metric], errors="coerce") if math.isfinite(v)]
            for i in (a, b))
    if not x or not y:
        return ["-", "-"]
    return [f"{sum(x) / len(x) - sum(y) / len(y):+.4f}", fmt_p(welch_p(x, y))]


def pair_table(data: Data, names: dict[int, str]) -> tuple[Table, str] | None:
    """The pairs' table and sentence; None when the ablation declares none or this profile has none of its cells."""
    cells, found = data.cells, []
    for what, (mine, theirs) in getattr(data.ablation, "pairs", {}).items():
        a, b = _match(data, mine), _match(data, theirs)
        if a is not None and b is not None:
            found.append((what, a, b))
    if not found:
        return None
    values = [(cells.at[a, "values"], cells.at[b, "values"]) for _, a, b in found]
    ps = [welch_p(x, y) for x, y in values]
    comps = [Comparison(sum(x) / len(x) - sum(y) / len(y) if len(x) and len(y) else float("nan"), p, h,
                        min(len(x), len(y))) for (x, y), p, h in zip(values, ps, holm(ps))]
    further = measured(data.ablation.columns, cells)
    notes = "".join(f"; Δ {t}: the same difference in {t}, one Welch test each, uncorrected" for t in further.values())
    table = Table(f"Direct pairs: each cell against the one it is paired with (Welch, Holm over the pairs{notes})",
                  ["pair", "cell", "accuracy", "against", "its accuracy", "Δ", "p", "Holm p",
                   *[x for t in further.values() for x in (f"Δ {t}", f"p ({t})")]], [])
    said = []
    for (what, a, b), comp in zip(found, comps):
        also = {t: _further(data, m, a, b) for m, t in further.items()}
        table.rows.append([what, names[a], fmt_acc(cells.at[a, "mean"], cells.at[a, "std"], cells.at[a, "n"]), names[b],
                           fmt_acc(cells.at[b, "mean"], cells.at[b, "std"], cells.at[b, "n"]), *comparison_text(comp),
                           *[x for pair in also.values() for x in pair]])
        verdict = {"higher": "higher by more than seed noise", "lower": "lower by more than seed noise",
                   "not shown": "no difference shown (no proof of equality)"}.get(comp.outcome, comp.outcome)
        said.append(f"{what}: {names[a]} against {names[b]} " + (
            f"{comp.diff:+.4f} (Welch p={fmt_p(comp.p)}, Holm p={fmt_p(comp.holm)}), {verdict}" if comp.n else
            "cannot tell (a cell has no finished run)")
            + "".join(f", {t} {d} (Welch p={p})" for t, (d, p) in also.items() if d != "-"))
    return table, "direct pairs: " + "; ".join(said)
