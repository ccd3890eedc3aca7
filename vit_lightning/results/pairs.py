"""An ablation's direct pairs (Ablation.pairs): each named cell tested against the one it is paired with, beside the
grid's tests against the baseline and the best (Swin's shifted against unshifted windows, both with the relative bias)."""

from __future__ import annotations

from vit_lightning.results.render import Table
from vit_lightning.results.shapes import Data, comparison_text, fmt_acc, value_key
from vit_lightning.results.stats import Comparison, fmt_p, holm, welch_p


def _match(data: Data, partial: dict) -> int | None:
    """The one designed cell whose values include `partial`, else None (a profile without that cell)."""
    hits = [i for i, c in data.cells.iterrows()
            if all(k in c and value_key(c[k]) == value_key(v) for k, v in partial.items())]
    return hits[0] if len(hits) == 1 else None


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
    table = Table("Direct pairs: each cell against the one it is paired with (Welch, Holm over the pairs)",
                  ["pair", "cell", "accuracy", "against", "its accuracy", "Δ", "p", "Holm p"], [])
    said = []
    for (what, a, b), comp in zip(found, comps):
        table.rows.append([what, names[a], fmt_acc(cells.at[a, "mean"], cells.at[a, "std"], cells.at[a, "n"]), names[b],
                           fmt_acc(cells.at[b, "mean"], cells.at[b, "std"], cells.at[b, "n"]), *comparison_text(comp)])
        verdict = {"higher": "higher by more than seed noise", "lower": "lower by more than seed noise",
                   "not shown": "no difference shown (no proof of equality)"}.get(comp.outcome, comp.outcome)
        said.append(f"{what}: {names[a]} against {names[b]} " + (
            f"{comp.diff:+.4f} (Welch p={fmt_p(comp.p)}, Holm p={fmt_p(comp.holm)}), {verdict}" if comp.n else
            "cannot tell (a cell has no finished run)"))
    return table, "direct pairs: " + "; ".join(said)
