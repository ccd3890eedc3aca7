"""The table of a searched profile (Profile.search): what it spent per set-up against its grid, and where its best
point lands against the grid's fitted optimum."""

from __future__ import annotations

import pandas as pd

from vit_lightning.commands.results.optimum import fmt_lr, optimum
from vit_lightning.core.identity import same
from vit_lightning.records.render import Report, Table
from vit_lightning.records.shapes import Data, fmt_value, label, report


def _of(frame: pd.DataFrame, values: dict) -> pd.DataFrame:
    """The rows of one set-up (its values of the keys not searched)."""
    keep = [all(same(row[k], v) for k, v in values.items()) for _, row in frame.iterrows()]
    return frame[keep] if len(frame) else frame


def _epochs(data: Data, runs: pd.DataFrame) -> int:
    """Epochs the runs trained (their records' histories)."""
    return sum(len(data.history.get(name) or []) for name in runs["name"])


def _grid_fit(cells: pd.DataFrame, key: str, seed: int):
    """The grid's fitted optimum of one set-up (the grid table's), None with fewer than three finished points."""
    done = cells[cells["n"] > 0].sort_values(key)
    return optimum(done[key].tolist(), done["values"].tolist(), seed) if len(done) >= 3 else None


def build_search(data: Data) -> Report:
    """Per set-up: trials and epochs of the search and of its grid, its best point and the grid's fitted optimum."""
    prof, grid = data.profile, data.other
    key = next(iter(prof.search["parameters"]))  # the searched key the comparison reads (a learning rate)
    setup = [k for k in prof.axes if k != key]
    corner = "/".join(map(label, setup))
    name = grid.profile.name if grid else prof.search.get("grid", "grid")
    table = Table(f"{prof.search['method']} search of {label(key)} against the {name} grid, per {corner}",
                  [corner, "trials (stopped early)", "epochs", f"best {label(key)}", "its accuracy",
                   f"{name}: trials", f"{name}: epochs", "fitted optimum", "95% interval", "best inside"], [])
    spent, inside, outside = [0, 0, 0, 0], 0, []
    for seed, block in enumerate(prof.grids):
        values = {k: block[k][0] for k in setup}
        mine = _of(data.runs, values)
        done = mine[(mine["note"] == "") & mine[data.ablation.metric].notna()]
        best = done.loc[done[data.ablation.metric].idxmax()] if len(done) else None
        theirs = _of(grid.runs, values) if grid else mine.iloc[:0]
        fit = _grid_fit(_of(grid.cells, values), key, seed) if grid else None
        judged = best is not None and fit is not None and fit.low is not None
        hit = judged and fit.low <= best[key] <= fit.high
        label_ = "/".join(fmt_value(v) for v in values.values())
        inside, outside = inside + hit, outside + ([label_] if judged and not hit else [])
        row = [len(mine), _epochs(data, mine), len(theirs), _epochs(grid, theirs) if grid else 0]
        spent = [a + b for a, b in zip(spent, row)]
        stopped = int((mine["status"] == "stopped_early").sum())
        table.rows.append([
            label_, f"{row[0]} ({stopped})", str(row[1]), fmt_lr(best[key]) if best is not None else "-",
            f"{best[data.ablation.metric]:.4f}" if best is not None else "missing", str(row[2]), str(row[3]),
            fmt_lr(fit.lr) if fit else "-", f"{fmt_lr(fit.low)} to {fmt_lr(fit.high)}" if fit and fit.low else "-",
            ("yes" if hit else "no") if judged else "-"])
    share = f" ({spent[1] / spent[3]:.0%} of its epochs)" if spent[3] else ""
    seen = (f"the search trained {spent[0]} trials for {spent[1]} epochs against the {name} grid's {spent[2]} trials "
            f"for {spent[3]} epochs{share}; its best {label(key)} lies inside the grid's 95% interval for {inside} "
            f"of {len(prof.grids)} set-ups" + (f" (outside: {', '.join(outside)})" if outside else ""))
    tests = (f"the best {label(key)}: the finished trial with the highest {data.ablation.metric} at one seed (a "
             f"single run: no interval); fitted optimum and its 95% interval: the {name} grid table's (a parabola in "
             f"log10({label(key)}) through its best grid point and neighbours, parametric bootstrap over its seeds); "
             "trials stopped early by hyperband count in the spend, not as finished")
    return report(data, [table], tests, seen)
