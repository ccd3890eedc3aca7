"""One builder per table layout: cell stats -> Report (tables, the computed verdict, figures)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from vit_lightning.results import plots
from vit_lightning.results.frame import cell_frame, runs_frame, with_best
from vit_lightning.bookkeeping import write_atomic
from vit_lightning.results.store import load_records
from vit_lightning.results.render import Report, Table, to_latex, to_markdown
from vit_lightning.results.stats import ALPHA, beats, fmt_p, verdict, welch_p


@dataclass
class Data:
    ablation: Any
    profile: Any
    runs: pd.DataFrame  # one row per record (runs_frame)
    cells: pd.DataFrame  # one row per designed cell (cell_frame)
    history: dict[str, list[dict]]  # run name -> per-epoch metrics


# ---- text helpers -----------------------------------------------------------------------------

def label(key: str) -> str:
    """Short column label for a dotted key: model.pos_encoding -> pos_encoding."""
    return key.rsplit(".", 1)[-1]


def fmt_value(value: Any) -> str:
    """A swept value as text (floats in %g so 8e-4 reads 0.0008)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def fmt_acc(mean: float, std: float, n: int) -> str:
    """Cell text: 'mean ± std (n=k)', 'mean (n=1)' or 'missing'."""
    if n == 0:
        return "missing"
    return f"{mean:.4f} (n=1)" if n == 1 else f"{mean:.4f} ± {std:.4f} (n={n})"


def fmt_num(value: Any, spec: str) -> str:
    """A number in a fixed format, '-' when unknown."""
    return "-" if value is None or pd.isna(value) else format(value, spec)


def fmt_paper(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:g}"


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)  # hashable stand-in for list-valued cells


def header(data: Data, seen: str) -> list[tuple[str, str]]:
    """The lines above the tables: what the ablation is, how we ran it, and whether we see the finding."""
    ab, prof = data.ablation, data.profile
    fixed = ", ".join(f"{k}={fmt_value(v)}" for k, v in sorted(prof.fixed.items()) if not k.startswith("run."))
    return [("Source", ab.source), ("Paper's finding", ab.finding), ("Paper's numbers", ab.reference_note),
            ("Profile", f"{prof.name}" + (f" ({prof.description})" if prof.description else "")
             + f"; seeds {', '.join(map(str, prof.seeds))}; {fixed}"),
            ("Metric", f"{ab.metric}; cells are mean ± sample std (ddof=1) over seeds, n = finished runs "
                       "averaged; N/A: not part of the design; missing: designed, no finished run"),
            ("Seed noise", f"each cell vs the best (bold) by Welch's t-test (scipy ttest_ind, equal_var=False); "
                           f"'≈ best': p ≥ {ALPHA}, not distinguishable from the best; n=1: no test"),
            ("Our result", seen)]


def excluded(data: Data) -> Table:
    """Runs that are not averaged (failed, diverged, running, off-design, superseded), with why."""
    keys = list(data.profile.axes)
    bad = data.runs[data.runs["note"] != ""]
    rows = [[r["name"], *(fmt_value(r[k]) for k in keys), fmt_num(r["seed"], ""), str(r["status"]), r["note"],
             r["error"]] for _, r in bad.iterrows()]
    return Table("Runs not averaged", ["run", *map(label, keys), "seed", "status", "why", "error"], rows)


def report(data: Data, tables: list[Table], seen: str, figures=()) -> Report:
    ab, prof = data.ablation, data.profile
    return Report(ab.title, f"vit-ablate table {ab.name} --profile {prof.name}",
                  header(data, seen), tables, excluded(data), list(figures))


# ---- shared table shapes ------------------------------------------------------------------------

def grid_tables(cells: pd.DataFrame, row_key: str, col_key: str | None, caption: str, rows=None) -> list[Table]:
    """Rows x columns of ours (beside the paper's when it has values), then the same grid of tests vs the best."""
    at = {(_key(c[row_key]), _key(c[col_key]) if col_key else ""): c for _, c in cells.iterrows()}
    rows = rows or list(dict.fromkeys(map(_key, cells[row_key])))
    cols = list(dict.fromkeys(map(_key, cells[col_key]))) if col_key else [""]
    names = [fmt_value(json.loads(c)) for c in cols] if col_key else ["ours"]
    paper = cells["paper"].notna().any()
    ours = Table(caption, [label(row_key)] + [x for n in names for x in ([n, f"{n} (paper)"] if paper else [n])], [])
    tests = Table(f"{caption}: Welch t-test vs the best", [label(row_key), *names], [])
    for i, r in enumerate(rows):
        line, test = [fmt_value(json.loads(r))], [fmt_value(json.loads(r))]
        for c in cols:
            cell = at.get((r, c))
            if cell is None:  # not in any grid block
                line += ["N/A"] * (2 if paper else 1)
                test.append("N/A")
                continue
            if cell["best"]:
                ours.bold.add((i, len(line)))
                tests.bold.add((i, len(test)))
            line += [fmt_acc(cell["mean"], cell["std"], cell["n"])] + ([fmt_paper(cell["paper"])] if paper else [])
            test.append(cell["vs_best"] or "missing")
        ours.rows.append(line)
        tests.rows.append(test)
    return [ours, tests]


def cells_table(data: Data, caption: str) -> Table:
    """One row per designed cell: swept values, accuracy (beside the paper's), test vs best, compute."""
    keys, paper = list(data.profile.axes), data.cells["paper"].notna().any()
    table = Table(caption, [*map(label, keys), "accuracy", *(["paper"] if paper else []), "vs best", "params",
                            "GFLOPs/image", "images/s"], [])
    for i, c in data.cells.iterrows():
        table.rows.append([*(fmt_value(c[k]) for k in keys), fmt_acc(c["mean"], c["std"], c["n"]),
                           *([fmt_paper(c["paper"])] if paper else []), c["vs_best"] or "missing",
                           fmt_num(c["params"], ",.0f"), fmt_num(c["gflops_per_image"], ".4g"),
                           fmt_num(c["train_images_per_s"], ".1f")])
        if c["best"]:
            table.bold |= {(i, len(keys)), (i, len(keys) + 1 + paper)}
    return table


def best_per(cells: pd.DataFrame, key: str) -> pd.DataFrame:
    """The highest-mean cell for each value of key (first in design order on ties), finished cells only."""
    done = cells[cells["n"] > 0]
    return done.loc[done.groupby(done[key].map(_key), sort=False)["mean"].idxmax()]


def _names(data: Data, cell: pd.Series) -> list[str]:
    """The finished runs averaged into a cell."""
    runs = data.runs
    return runs[(runs["note"] == "") & (runs["cell"] == cell["cell"])]["name"].tolist()


def mean_curve(data: Data, cell: pd.Series, metric: str = "val/acc") -> tuple[list[float], list[float]]:
    """Epochs and the seed-mean of metric over a cell's finished runs' histories."""
    rows = [h for name in _names(data, cell) for h in data.history.get(name, []) if metric in h]
    if not rows:
        return [], []
    curve = pd.DataFrame(rows).groupby("epoch")[metric].mean()
    return [float(e) for e in curve.index], curve.tolist()


# ---- the layouts --------------------------------------------------------------------------------

def build_grid(data: Data) -> Report:
    """Table 8 layout: rows x columns (encoding x injection); checks 'every encoding beats none'."""
    ab, cells = data.ablation, data.cells
    extra = set(data.profile.axes) - {ab.rows, ab.cols}
    if extra:
        return build_cells(data)
    tables = grid_tables(cells, ab.rows, ab.cols, "Ours beside the paper")
    best = best_per(cells, ab.rows)
    none = best[best[ab.rows] == "none"]
    others = best[best[ab.rows] != "none"]
    if none.empty:
        seen = "cannot tell: the baseline 'none' has no finished run" if (cells[ab.rows] == "none").any() else \
            f"best cell: {_describe(data)}"
        return report(data, tables, seen)
    flags = {r[ab.rows]: beats(r["values"], none.iloc[0]["values"]) for _, r in others.iterrows()}
    top = cells[cells["best"]].iloc[0]["values"]
    alike = {r[ab.rows]: _alike(r["values"], top) for _, r in others.iterrows()}
    seen = (f"every encoding beats none by more than seed noise: {_with_exceptions(flags)}; "
            f"the encodings are alike (each one's best cell within seed noise of the best): {_with_exceptions(alike)}")
    return report(data, tables, seen)


def build_lr(data: Data) -> Report:
    """CLS vs GAP (Figure 9): accuracy per lr per pooling, each pooling at its own best lr, and curves."""
    pool, lr = "model.pooling", "model.lr"
    if not {pool, lr} <= set(data.profile.axes):
        raise ValueError(f"{data.ablation.name}: the lr layout needs {pool} and {lr} swept")
    groups = data.cells.groupby(data.cells[pool].map(_key), sort=False)
    cells = pd.concat([with_best(g) for _, g in groups]).sort_values("cell").reset_index(drop=True)
    lrs = [_key(v) for v in sorted(set(cells[lr]))]
    tables = grid_tables(cells, lr, pool, "Accuracy per learning rate (bold: each pooling's best)", rows=lrs)
    tables[1].caption = "Welch t-test vs each pooling's best learning rate"
    best = with_best(best_per(cells, pool))
    paper = cells["paper"].notna().any()
    own = Table("Each pooling at its own best learning rate",
                ["pooling", "best lr", "accuracy", *(["paper"] if paper else []), "vs best"],
                [[str(b[pool]), fmt_value(b[lr]), fmt_acc(b["mean"], b["std"], b["n"]),
                  *([fmt_paper(b["paper"])] if paper else []), b["vs_best"]] for _, b in best.iterrows()],
                {(i, 2) for i in range(len(best)) if best.iloc[i]["best"]})
    tables.append(own)
    seen = "cannot tell: fewer than two poolings have finished runs"
    if len(best) > 1:
        winner = best[best["best"]].iloc[0]
        same = {b[pool]: _alike(b["values"], winner["values"]) for _, b in best.iterrows() if not b["best"]}
        answer = _with_exceptions(same)
        if answer.startswith("not shown"):
            behind = ", ".join(str(k) for k, f in same.items() if f is False)
            answer = f"no, {winner[pool]} beats {behind} by more than seed noise"
        lrs_text = ", ".join(f"{b[pool]} {fmt_value(b[lr])}" for _, b in best.iterrows())
        seen = (f"the poolings reach the same accuracy at their own best learning rates: {answer}; "
                f"best learning rates: {lrs_text} (they differ: {'yes' if best[lr].nunique() > 1 else 'no'})")
    figures = [("lr_curve.png", "accuracy vs learning rate per pooling", lambda p: _lr_curve(data, cells, p)),
               ("training_curves.png", "validation accuracy per epoch", lambda p: _training_curves(data, best, cells, p))]
    return report(data, tables, seen, figures)


def build_patch_size(data: Data) -> Report:
    """Patch size: accuracy and compute per patch size, and accuracy vs GFLOPs."""
    key, cells = "model.patch_size", data.cells
    best = best_per(cells, key).sort_values(key)
    seen = "cannot tell: fewer than two patch sizes have finished runs"
    if len(best) > 1:
        falls = best["mean"].is_monotonic_decreasing
        small, large = best.iloc[0], best.iloc[-1]
        dearer = best["gflops_per_image"].dropna().is_monotonic_decreasing
        seen = (f"accuracy falls as the patch size grows: {'yes' if falls else 'no'}; patch {small[key]} beats patch "
                f"{large[key]} by more than seed noise: {_yes_no(beats(small['values'], large['values']))}; "
                f"smaller patches cost more GFLOPs: {'yes' if dearer else 'no'}")
    points = cells[(cells["n"] > 0) & cells["gflops_per_image"].notna()].sort_values("gflops_per_image")
    series = [("ours", points["gflops_per_image"].tolist(), points["mean"].tolist(), points["std"].fillna(0).tolist(),
               "o-")] if len(points) else []
    draw = lambda p: plots.line_plot(p, series, "GFLOPs per image", data.ablation.metric,  # noqa: E731
                                     "Accuracy vs compute", logx=True,
                                     annotate={"ours": [f"patch {v}" for v in points[key]]})
    return report(data, [cells_table(data, "Accuracy and compute per patch size")], seen,
                  [("accuracy_vs_compute.png", "accuracy vs GFLOPs per image", draw)])


def build_hybrid(data: Data) -> Report:
    """Hybrid: the patch stem vs the ResNet (hybrid) stem, accuracy and compute."""
    key = "model.stem"
    best = best_per(data.cells, key)
    hybrid, patch = best[best[key] == "hybrid"], best[best[key] == "patch"]
    seen = "cannot tell: the patch or the hybrid stem has no finished run"
    if len(hybrid) and len(patch):
        h, p = hybrid.iloc[0], patch.iloc[0]
        pv = welch_p(h["values"], p["values"])
        seen = (f"the hybrid stem beats the patch stem by more than seed noise: {_yes_no(beats(h['values'], p['values']))}"
                + (f" ({fmt_p(pv)})" if pv is not None else ""))
    return report(data, [cells_table(data, "Patch stem vs hybrid stem")], seen)


def build_cells(data: Data) -> Report:
    """Any other design: one row per cell."""
    return report(data, [cells_table(data, "Accuracy and compute per cell")],
                  f"best cell: {_describe(data)}")


BUILDERS: dict[str, Callable[[Data], Report]] = {
    "pos_encoding": build_grid, "cls_vs_gap": build_lr, "patch_size": build_patch_size, "hybrid": build_hybrid}


# ---- verdict helpers ----------------------------------------------------------------------------

def _yes_no(flag: bool | None) -> str:
    return {True: "yes", False: "no", None: "cannot tell (n=1)"}[flag]


def _alike(values: list[float], best: list[float]) -> bool | None:
    """Not distinguishable from the best cell (Welch p ≥ ALPHA); None if untestable."""
    p = welch_p(values, best)
    return None if p is None else p >= ALPHA


def _with_exceptions(flags: dict[Any, bool | None]) -> str:
    """'yes', or 'not shown for x, y' naming those that fail the test, or 'cannot tell (n<2: z)'."""
    answer = verdict(list(flags.values()))
    if answer == "no":
        return f"not shown for {', '.join(str(k) for k, f in flags.items() if f is False)}"
    if answer == "cannot tell":
        return f"cannot tell (n<2: {', '.join(str(k) for k, f in flags.items() if f is None) or 'nothing to compare'})"
    return answer


def _describe(data: Data) -> str:
    """The best cell as 'key=value, ... (mean)'."""
    best = data.cells[data.cells["best"]]
    if best.empty:
        return "none (no finished runs)"
    b, keys = best.iloc[0], list(data.profile.axes)
    return ", ".join(f"{label(k)}={fmt_value(b[k])}" for k in keys) + f" ({b['mean']:.4f})"


# ---- figures ------------------------------------------------------------------------------------

def _lr_curve(data: Data, cells: pd.DataFrame, path: Path) -> None:
    """Accuracy vs learning rate, one line per pooling, error bars = sample std (0 for n=1)."""
    lr, done, series = "model.lr", cells[cells["n"] > 0], []
    for name, g in done.groupby(done["model.pooling"].map(str), sort=False):
        g = g.sort_values(lr)
        series.append((name, g[lr].tolist(), g["mean"].tolist(), g["std"].fillna(0).tolist(), "o-"))
    plots.line_plot(path, series, "learning rate", data.ablation.metric, "Accuracy vs learning rate", logx=True)


def _training_curves(data: Data, best: pd.DataFrame, cells: pd.DataFrame, path: Path) -> None:
    """Each pooling at its own best lr (solid) and at the first pooling's best lr (dashed), like Figure 9."""
    pool, lr, series = "model.pooling", "model.lr", []
    shared = best.iloc[0][lr] if len(best) else None
    for _, b in best.iterrows():
        picks = [(b, "best lr", "-")]
        other = cells[(cells[pool] == b[pool]) & (cells[lr] == shared) & (cells["n"] > 0)]
        if b[lr] != shared and len(other):
            picks.append((other.iloc[0], f"{best.iloc[0][pool]}'s best lr", "--"))
        for cell, why, style in picks:
            x, y = mean_curve(data, cell)
            if x:
                series.append((f"{cell[pool]}, lr={fmt_value(cell[lr])} ({why})", x, y, None, style))
    plots.line_plot(path, series, "epoch", "val/acc", "Validation accuracy per epoch", integer_x=True)


# ---- the files ----------------------------------------------------------------------------------

def build(ablation: Any, profile: Any, out: Path) -> list[Path]:
    """Regenerate runs.csv, table.md, table.tex and figures in out from out/records; the paths written."""
    out = Path(out)
    records = load_records(out / "records")
    runs = runs_frame(ablation, profile, records)
    cells = cell_frame(ablation, profile, runs)
    data = Data(ablation, profile, runs, cells, {r["name"]: r.get("history") or [] for r in records})
    rep = BUILDERS.get(ablation.name, build_grid)(data)
    csv = runs.drop(columns=["cell", "time"])
    for col in ("seed", "params"):  # keep integers integral even when some runs lack them
        csv[col] = pd.to_numeric(csv[col], errors="coerce").round().astype("Int64")
    files = {"runs.csv": csv.to_csv(index=False, float_format="%.6g", lineterminator="\n"),
             "table.md": to_markdown(rep), "table.tex": to_latex(rep)}
    for name, text in files.items():
        write_atomic(out / name, text.encode())
    for png, _, draw in rep.figures:
        draw(out / png)
    return [out / name for name in files] + [out / png for png, _, _ in rep.figures]
