"""The table of a searched profile (Profile.search): what it spent per set-up against its grid, where its best
point lands against the grid's fitted optimum, and (with a confirmation stage) its confirmed points tested against
the grid's best cell, both at the same number of seeds."""

from __future__ import annotations

import math

import pandas as pd

from vit_lightning.commands.results.optimum import fmt_lr, optimum
from vit_lightning.commands.results.verdicts import CAPTION
from vit_lightning.core.identity import same
from vit_lightning.records.render import Report, Table
from vit_lightning.records.shapes import Data, fmt_acc, fmt_value, label, report
from vit_lightning.records.stats import ALPHA, fmt_p, holm, summarize, tost_p, welch_p


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


def points(done: pd.DataFrame, key: str, metric: str) -> dict[float, list[float]]:
    """A set-up's finished search runs grouped by their point (the searched value): value -> metrics, seed order."""
    out: dict[float, list[float]] = {}
    for _, row in done.sort_values("seed" if "seed" in done else key).iterrows():
        match = next((p for p in out if same(p, row[key])), row[key])
        out.setdefault(match, []).append(float(row[metric]))
    return out


def choice(pts: dict[float, list[float]], seeds: int) -> tuple[float, list[float]] | None:
    """The search's choice: the point with the best mean among those at `seeds` seeds or more (the confirmed), or
    among all when none is (no confirmation, or not run yet)."""
    pool = {p: v for p, v in pts.items() if len(v) >= seeds} or pts
    return max(pool.items(), key=lambda item: sum(item[1]) / len(item[1])) if pool else None


def _acc(values: list[float]) -> str:
    """A point's accuracy: one run's value, or mean ± std (n)."""
    return f"{values[0]:.4f}" if len(values) == 1 else fmt_acc(*summarize(values))


def build_search(data: Data) -> Report:
    """Per set-up: trials and epochs of the search and of its grid, its best point and the grid's fitted optimum."""
    prof, grid = data.profile, data.other
    key = next(iter(prof.search["parameters"]))  # the searched key the comparison reads (a learning rate)
    setup = [k for k in prof.axes if k != key]
    corner = "/".join(map(label, setup))
    name = grid.profile.name if grid else prof.search.get("grid", "grid")
    confirm = prof.search.get("confirm")
    n_seeds = confirm["seeds"] if confirm else 1
    table = Table(f"{prof.search['method']} search of {label(key)} against the {name} grid, per {corner}",
                  [corner, "trials (stopped early)", "epochs", f"best {label(key)}", "its accuracy",
                   f"{name}: trials", f"{name}: epochs", "fitted optimum", "95% interval", "best inside"], [])
    spent, inside, outside, confirmed, found = [0, 0, 0, 0], 0, [], [], {}
    for seed, block in enumerate(prof.grids):
        values = {k: block[k][0] for k in setup}
        mine = _of(data.runs, values)
        done = mine[(mine["note"] == "") & mine[data.ablation.metric].notna()]
        pts = points(done, key, data.ablation.metric)
        best = choice(pts, n_seeds)
        theirs = _of(grid.runs, values) if grid else mine.iloc[:0]
        cells = _of(grid.cells, values) if grid else None
        fit = _grid_fit(cells, key, seed) if grid else None
        judged = best is not None and fit is not None and fit.low is not None
        hit = judged and fit.low <= best[0] <= fit.high
        label_ = "/".join(fmt_value(v) for v in values.values())
        inside, outside = inside + hit, outside + ([label_] if judged and not hit else [])
        found[label_] = ("inside the grid's interval" if hit else "outside the grid's interval") if judged else \
            "not settled (no best point or no interval)"
        row = [len(mine), _epochs(data, mine), len(theirs), _epochs(grid, theirs) if grid else 0]
        spent = [a + b for a, b in zip(spent, row)]
        stopped = int((mine["status"] == "stopped_early").sum())
        table.rows.append([
            label_, f"{row[0]} ({stopped})", str(row[1]), fmt_lr(best[0]) if best is not None else "-",
            _acc(best[1]) if best is not None else "missing", str(row[2]), str(row[3]),
            fmt_lr(fit.lr) if fit else "-", f"{fmt_lr(fit.low)} to {fmt_lr(fit.high)}" if fit and fit.low else "-",
            ("yes" if hit else "no") if judged else "-"])
        if confirm:
            confirmed.append((label_, {p: v for p, v in pts.items() if len(v) >= n_seeds}, cells))
    share = f" ({spent[1] / spent[3]:.0%} of its epochs)" if spent[3] else ""
    seen = (f"the search trained {spent[0]} trials for {spent[1]} epochs against the {name} grid's {spent[2]} trials "
            f"for {spent[3]} epochs{share}; its best {label(key)} lies inside the grid's 95% interval for {inside} "
            f"of {len(prof.grids)} set-ups" + (f" (outside: {', '.join(outside)})" if outside else ""))
    tables = [table]
    if confirm:
        test, said = confirmation(confirmed, key, corner, name, confirm, data.ablation.equivalence_margin)
        tables.append(test)
        seen += f"; {said}"
    grid_verdicts = Table(CAPTION, ["cell", f"best {label(key)} found"], [[k, v] for k, v in found.items()])
    return report(data, tables, tests_text(prof.search, key, name, data.ablation), seen, verdicts=grid_verdicts)


def tests_text(search: dict, key: str, name: str, ablation) -> str:
    """The header's line on how the best point is chosen and tested."""
    confirm = search.get("confirm")
    chosen = (f"the best {label(key)}: the point with the highest mean {ablation.metric} among the top "
              f"{confirm['top']} (by their mean at the search's seeds) trained on to {confirm['seeds']} seeds"
              if confirm else f"the best {label(key)}: the finished trial with the highest {ablation.metric} at one "
              "seed (a single run: no interval)")
    text = (f"{chosen}; fitted optimum and its 95% interval: the {name} grid table's (a parabola in "
            f"log10({label(key)}) through its best grid point and neighbours, parametric bootstrap over its seeds); "
            "trials stopped early by hyperband count in the spend, not as finished")
    if confirm:
        margin = ablation.equivalence_margin
        text += (f"; each confirmed point against the {name} grid's best cell of its set-up: Welch's t-test, Holm "
                 f"over every confirmed point (alpha {ALPHA})" + (f", and TOST within ±{margin:g}" if margin else ""))
    return text


def confirmation(confirmed: list, key: str, corner: str, name: str, confirm: dict, margin: float):
    """The confirmed points against the grid's best cell of their set-up (Welch, Holm; TOST with a margin), and a
    sentence saying what the test found."""
    columns = [corner, f"search: {label(key)}", "its accuracy", f"{name} best: {label(key)}", "its accuracy",
               "difference", "p (Welch)", "p (Holm)"] + (["equivalent (TOST, Holm)"] if margin else [])
    rows, ps, tosts = [], [], []
    for setup, pts, cells in confirmed:
        done = cells[cells["n"] > 0] if cells is not None else None
        ref = done.loc[done["mean"].idxmax()] if done is not None and len(done) else None
        for point, values in sorted(pts.items()) or [(None, [])]:
            theirs = list(ref["values"]) if ref is not None else []
            ps.append(welch_p(values, theirs) if values else None)
            tosts.append(tost_p(values, theirs, margin) if values and margin else None)
            diff = summarize(values)[0] - summarize(theirs)[0] if values and theirs else math.nan
            rows.append([setup, fmt_lr(point) if point is not None else "-", _acc(values) if values else "not confirmed",
                         fmt_lr(ref[key]) if ref is not None else "-", fmt_acc(*summarize(theirs)),
                         "-" if math.isnan(diff) else f"{diff:+.4f}"])
    adjusted, equiv = holm(ps), holm(tosts)
    for row, p, h, e in zip(rows, ps, adjusted, equiv):
        row += [fmt_p(p), fmt_p(h)] + ([fmt_p(e) + (" (yes)" if e is not None and e < ALPHA else "")] if margin else [])
    worse = sum(1 for r, h in zip(rows, adjusted) if h is not None and h < ALPHA and r[5].startswith("-"))
    better = sum(1 for r, h in zip(rows, adjusted) if h is not None and h < ALPHA and r[5].startswith("+"))
    tested = sum(h is not None for h in adjusted)
    said = (f"of {tested} confirmed points at {confirm['seeds']} seeds, {worse} below and {better} above the {name} "
            f"grid's best cell (Holm p < {ALPHA})" if tested else "no point confirmed yet")
    caption = (f"the top {confirm['top']} points at {confirm['seeds']} seeds against the {name} grid's best cell, "
               f"per {corner}")
    return Table(caption, columns, rows), said
