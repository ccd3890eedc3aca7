"""What every layout shares: the data a builder reads, cell text, the header, and the common table shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from vit_lightning.ablation import beyond, selector
from vit_lightning.records.render import Report, Table
from vit_lightning.records.stats import ALPHA, Comparison, fmt_p

COMPUTE_COLUMNS = {"params": ("params", ",.0f"), "gflops_per_image": ("GFLOPs/image", ".4g"),
                   "train_images_per_s": ("images/s", ".1f")}


@dataclass
class Data:
    ablation: Any
    profile: Any
    runs: pd.DataFrame  # one row per record (runs_frame)
    cells: pd.DataFrame  # one row per designed cell (cell_frame)
    history: dict[str, list[dict]]  # run name -> per-epoch metrics
    other: Data | None = None  # another draw of the same design (--compare-with), its verdicts shown beside these
    other_source: str = ""  # where the other draw's records came from, as the user named it
    records: dict[str, dict] = field(default_factory=dict)  # run name -> its record (eval results)
    flags: str = ""  # the command's further flags, named in the header (--metric M: a table in another metric)


# ---- text ---------------------------------------------------------------------------------------

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


def fmt_paper(value: float | str | None) -> str:
    if isinstance(value, str):
        return value
    return "-" if value is None or pd.isna(value) else f"{value:g}"


def value_key(value: Any) -> str:
    """A hashable, order-stable stand-in for a cell value (lists included)."""
    return json.dumps(value, sort_keys=True)


def cell_name(cell: pd.Series, keys: list[str]) -> str:
    """A cell in running text: its values joined by '/', numbers with their key: cls/mlp_tanh, patch_size=2."""
    return "/".join(fmt_value(cell[k]) if isinstance(cell[k], str) else f"{label(k)}={fmt_value(cell[k])}"
                    for k in keys)


def fmt_seeds(seeds) -> str:
    """Seeds as text: '7-13' for a contiguous range, else '0, 2, 5'."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def join(names: list[str]) -> str:
    """Names in running text (every caller has at least one)."""
    return ", ".join(names)


# ---- header, excluded runs, the report ----------------------------------------------------------

EQUIVALENCE = ("equivalence: two one-sided Welch tests (TOST) of |Δ| < {margin:g} against the same references, "
               f"Holm-corrected as their own family; 'equivalent': Holm p < {ALPHA}")
TESTS = (f"Welch's t-test (two-sided, scipy ttest_ind with equal_var=False) of each cell against {{refs}}; "
         f"Holm's correction within each family of tests, so a family's chance of any false 'higher' or 'lower' "
         f"stays below {ALPHA}; 'not shown': Holm p ≥ {ALPHA}, which is no proof of equality; no test with n<2")
BEST_CAVEAT = "the best cell is picked from the same runs, so tests against it lean towards finding a difference"
BEST_REF = "the best cell (bold)"


def selected(data: Data) -> str | None:
    """Per cell, the value each `select:` setting took in the averaged runs and what its selecting stage's records
    here scored per candidate (censored: a choice at the edge of the candidates tried; interior: inside them); None
    without such a setting."""
    prof, used = data.profile, data.runs[data.runs["note"] == ""]
    keys, lines = list(prof.axes), []
    for key, value in sorted(prof.fixed.items()):
        if (stage := selector(value)) is None:
            continue
        per_cell, nexts = [], {}
        for index, cell in data.cells.iterrows():
            names = used[used["cell"] == index]["name"]
            chosen = {(data.records.get(n, {}).get("config") or {}).get(key) for n in names} - {None}
            scores = _scores(data, stage, key, {k: cell[k] for k in keys})
            edge = _edge(chosen, list(scores))
            if edge:  # the value past it, as the values tried step there
                nexts[cell_name(cell, keys)] = beyond(list(scores), upward=edge == LARGEST)
            text = ", ".join(sorted(map(fmt_value, chosen))) or "missing"
            listed = ", ".join(f"{fmt_value(v)}: {m:.3f}" for v, m in scores.items())
            mark = f", censored ({edge})" if edge else ", interior" if len(chosen) == 1 and len(scores) >= 3 else ""
            per_cell.append(f"{cell_name(cell, keys)} {text}" + (f" ({listed})" if listed else "") + mark)
        found = any(r.get("profile") == stage for r in data.records.values())
        lines.append(f"{label(key)} per cell in the averaged runs, which the {stage} stage chooses (the value whose "
                     f"runs score best on their own validation data; in brackets its runs' {data.ablation.metric} per "
                     "value, mean over its runs)"
                     + ("" if found else f" (no records of {stage} here)")
                     + f": {'; '.join(per_cell)}" + _censored(data, stage, key, nexts, len(per_cell)))
    return "; ".join(lines) or None


LARGEST, SMALLEST = "the largest tried", "the smallest tried"


def _edge(chosen: set, tried: list) -> str:
    """LARGEST / SMALLEST when the one chosen value is at that edge of 3 or more tried, else ''."""
    if len(chosen) != 1 or len(tried) < 3:
        return ""
    (value,) = chosen
    return LARGEST if value == max(tried) else SMALLEST if value == min(tried) else ""


def _censored(data: Data, stage: str, key: str, nexts: dict, cells: int) -> str:
    """The sentence on the censored choices: the candidates of the stage's grid that no record here tried, or, once
    the grid has run, the value past each censored cell's edge that `sweep --extend-edges` trains next."""
    if not nexts:
        return ""
    grid = {v for block in data.ablation.profiles[stage].grids for v in block.get(key, [])} \
        if stage in data.ablation.profiles else set()
    tried = {(r.get("config") or {}).get(key) for r in data.records.values() if r.get("profile") == stage}
    untried = sorted(grid - tried)
    extend = "; ".join(f"{cell} {fmt_value(value)}" for cell, value in nexts.items())
    return (f"; censored in {len(nexts)} of {cells} cells: the held-out accuracy still rises at the edge of the "
            f"values tried, so each such cell's best {label(key)} lies at or beyond its choice (a bound, not a located "
            "optimum) and its accuracy may fall short of what a wider grid gives"
            + (f"; {stage} also lists {', '.join(map(fmt_value, untried))}, not run here (run {stage} again, then "
               "this stage, to place the choice inside the grid)" if untried else
               f"; next past each edge ({extend}): `vit-ablate sweep {data.ablation.name} --profile {stage} "
               "--extend-edges` trains them, then this stage again"))


def _scores(data: Data, stage: str, key: str, cell: dict) -> dict:
    """value -> mean metric of the selecting stage's finished records in this cell, in value order."""
    metric, by = data.ablation.metric, {}
    for rec in data.records.values():
        config = rec.get("config") or {}
        if rec.get("profile") != stage or rec.get("status") != "completed" or (rec.get("metrics") or {}).get(metric) \
                is None or any(value_key(config.get(k)) != value_key(v) for k, v in cell.items()):
            continue
        by.setdefault(config.get(key), []).append(float(rec["metrics"][metric]))
    return {v: sum(m) / len(m) for v, m in sorted(by.items(), key=lambda x: x[0])}


def measured(columns: dict[str, str], cells: pd.DataFrame) -> dict[str, str]:
    """The further columns (metric -> title) some cell's records hold (records older than a metric leave it out)."""
    return {k: title for k, title in columns.items() if k in cells and cells[k].map(lambda m: m[2] > 0).any()}


def header(data: Data, tests: str, seen: str) -> list[tuple[str, str]]:
    """The lines above the tables: what the ablation is, how we ran it, how we test, what the data show."""
    ab, prof = data.ablation, data.profile
    fixed = ", ".join(f"{k}={fmt_value(v)}" for k, v in sorted(prof.fixed.items()) if not k.startswith("run."))
    unshown = set(ab.columns.values()) - set(measured(ab.columns, data.cells).values())
    notes = {t: m for t, m in (getattr(ab, "column_notes", None) or {}).items() if t not in unshown}
    return [("Source", ab.source), ("Paper's finding", ab.finding), ("Paper's numbers", prof.reference_note or ab.reference_note),
            ("Profile", f"{prof.name}" + (f" ({prof.description})" if prof.description else "")
             + f"; seeds {', '.join(map(str, prof.seeds))}; {fixed}"),
            ("Metric", f"{ab.metric}; cells are mean ± sample std (ddof=1) over seeds"
                       + (f" and {ab.replicates} (the replicates)" if getattr(ab, "replicates", None) else "")
                       + ", n = finished runs "
                       "averaged; N/A: not part of the design; missing: designed, no finished run"),
            *([("Columns", "; ".join(f"'{t}': {m}" for t, m in notes.items()))] if notes else []),
            *([("Selected", chosen)] if (chosen := selected(data)) else []),
            ("Tests", tests), ("Our result", f"{seen.rstrip('.')}. {prof.scope}" if seen and prof.scope
                                             else seen or prof.scope)]


def excluded(data: Data) -> Table:
    """Runs that are not averaged (failed, diverged, running, off-design, superseded, unreadable entries), with
    why."""
    keys = list(data.profile.axes)
    bad = data.runs[data.runs["note"] != ""]
    rows = [[r["name"], *(fmt_value(r[k]) for k in keys), fmt_num(r["seed"], ""), str(r["status"]), r["note"],
             r["error"]] for _, r in bad.iterrows()]
    return Table("Runs not averaged", ["run", *map(label, keys), "seed", "status", "why", "error"], rows)


def report(data: Data, tables: list[Table], tests: str, seen: str, figures=(), verdicts: Table | None = None,
           notes: list[str] = ()) -> Report:
    ab, prof = data.ablation, data.profile
    again = f" --compare-with {data.other_source}" if data.other is not None else ""
    return Report(ab.title, f"vit-ablate table {ab.name} --profile {prof.name}{data.flags}{again}",
                  header(data, tests, seen), tables, excluded(data), list(figures), verdicts, list(notes))


# ---- table shapes -------------------------------------------------------------------------------

def grid_table(cells: pd.DataFrame, corner: str, caption: str, rows: list[str], cols: list[str]) -> Table:
    """cells['row'] x cells['col'] (text labels in the given order), beside the paper's values when it has any."""
    at = {(c["row"], c["col"]): c for _, c in cells.iterrows()}
    paper = cells["paper"].notna().any()
    table = Table(caption, [corner] + [x for n in cols for x in ([n, f"{n} (paper)"] if paper else [n])], [])
    for i, r in enumerate(rows):
        line = [r]
        for c in cols:
            cell = at.get((r, c))
            if cell is None:  # not in any grid block
                line += ["N/A"] * (2 if paper else 1)
                continue
            if cell["best"]:
                table.bold.add((i, len(line)))
            line += [fmt_acc(cell["mean"], cell["std"], cell["n"])] + ([fmt_paper(cell["paper"])] if paper else [])
        table.rows.append(line)
    return table


Family = tuple[str, dict[int, "Comparison | str"]]  # (reference's name, row -> its comparison or 'baseline'/'best')


def comparison_table(cells: pd.DataFrame, keys: list[str], caption: str, families: list[Family],
                     paper: bool = False, compute: bool = True, extra: dict[str, str] | None = None,
                     margin: float = 0.0) -> Table:
    """One row per cell: its values, further metrics (extra: key -> title), accuracy, then Δ, p and Holm p
    against each family's reference (and, with a margin, the equivalence test's Holm p), compute."""
    extra = extra or {}
    columns = [*map(label, keys), *extra.values(), "accuracy", *(["paper"] if paper else [])]
    for name, _ in families:
        columns += [f"Δ vs {name}", "p", "Holm p"] + ([f"≡ ±{margin:g} Holm p"] if margin > 0 else [])
    columns += [title for title, _ in COMPUTE_COLUMNS.values()] if compute else []
    table = Table(caption, columns, [])
    for i, (index, c) in enumerate(cells.iterrows()):
        line = [*(fmt_value(c[k]) for k in keys), *(fmt_acc(*c[m]) for m in extra), fmt_acc(c["mean"], c["std"], c["n"])]
        line += [fmt_paper(c["paper"])] if paper else []
        for _, family in families:
            line += comparison_text(family.get(index, "-"), margin)
        line += [fmt_num(c[k], spec) for k, (_, spec) in COMPUTE_COLUMNS.items()] if compute else []
        if c["best"]:
            table.bold.add((i, len(keys) + len(extra)))
        table.rows.append(line)
    return table


def comparison_text(comp: Comparison | str, margin: float = 0.0) -> list[str]:
    """[Δ, p, Holm p] for one comparison (and the equivalence test's Holm p with a margin); the reference itself
    reads its role ('baseline', 'best')."""
    tail = ["-"] if margin > 0 else []
    if isinstance(comp, str):
        return [comp, "-", "-"] + tail
    if comp.n == 0:
        return ["-", "-", "-"] + tail
    holm = fmt_p(comp.holm) + ("" if comp.holm is None or comp.holm >= ALPHA else f" ({comp.outcome})")
    if margin > 0:
        tail = [fmt_p(comp.equiv) + (" (equivalent)" if comp.equivalent else "")]
    return [f"{comp.diff:+.4f}", fmt_p(comp.p), holm] + tail


def outcomes(names: dict[int, str], family: dict[int, Comparison | str]) -> dict[str, list[tuple[str, Comparison]]]:
    """A family's comparisons grouped by outcome ('higher', 'lower', 'not shown', 'no test (n<2)')."""
    out: dict[str, list[tuple[str, Comparison]]] = {}
    for index, comp in family.items():
        if isinstance(comp, Comparison) and comp.n > 0:  # n=0: a missing cell, listed as missing elsewhere
            out.setdefault(comp.outcome, []).append((names[index], comp))
    return out


def listing(pairs: list[tuple[str, Comparison]]) -> str:
    """'a (+0.0123, Holm p=0.031), b (...)' for a few named comparisons; the names and the ranges for many."""
    if len(pairs) <= 3:
        return ", ".join(f"{name} ({c.diff:+.4f}, Holm p={fmt_p(c.holm)})" for name, c in pairs)
    diffs, ps = sorted(c.diff for _, c in pairs), sorted(c.holm for _, c in pairs)
    return (f"{', '.join(name for name, _ in pairs)} (differences {diffs[0]:+.4f} to {diffs[-1]:+.4f}, "
            f"Holm p {fmt_p(ps[0])} to {fmt_p(ps[-1])})")


def shortfall(groups: dict[str, list[tuple[str, Comparison]]], reference: str) -> str:
    """Why the comparisons that are not 'higher' fall short, cell by cell."""
    parts = []
    if untested := groups.get("no test (n<2)"):
        parts.append(f"no test for {join([name for name, _ in untested])} (fewer than 2 finished runs)")
    if lower := groups.get("lower"):
        parts.append(f"below {reference} by more than seed noise: {listing(lower)}")
    if unclear := groups.get("not shown"):
        seeds = min(c.n for _, c in unclear)
        parts.append(f"not shown for {listing(unclear)}: within seed noise of {reference} at {seeds} "
                     f"seed{'s' if seeds > 1 else ''} per cell")
    return "; ".join(parts)
