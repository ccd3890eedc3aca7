"""One builder per table layout (Ablation.layout); each reads its axes and baseline from the ablation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pandas as pd

from vit_lightning.commands.results import extrapolation, further, pairs, plots, position_use, settle, verdicts
from vit_lightning.commands.results.optimum import Optimum, differ, fmt_lr, optimum, ratio
from vit_lightning.commands.results.patch_transfer import PATCH, transfer_tables
from vit_lightning.commands.results.resolution import resolution_tables
from vit_lightning.core.names import SHUFFLE_DROP
from vit_lightning.records.frame import best_of
from vit_lightning.records.render import Report, Table
from vit_lightning.records.shapes import (
    BEST_CAVEAT,
    BEST_REF,
    EQUIVALENCE,
    TESTS,
    Data,
    Family,
    cell_name,
    comparison_table,
    comparison_text,
    fmt_acc,
    fmt_seeds,
    fmt_value,
    grid_table,
    join,
    label,
    listing,
    measured,
    outcomes,
    report,
    shortfall,
    value_key,
)
from vit_lightning.records.stats import Comparison, compare, fmt_p


def _names(data: Data) -> dict[int, str]:
    return {i: cell_name(c, list(data.profile.axes)) for i, c in data.cells.iterrows()}


def _unique(values) -> list:
    return list(dict.fromkeys(values))


def _best(cells: pd.DataFrame) -> int | None:
    """Index of the highest-mean finished cell (first in design order on ties)."""
    done = cells[cells["n"] > 0]
    return None if done.empty else int(done["mean"].idxmax())


def _baseline(data: Data) -> int | None:
    """Index of the ablation's baseline cell, None when it declares none."""
    base = data.ablation.baseline
    if base is None:
        return None
    hits = [i for i, c in data.cells.iterrows() if all(value_key(c[k]) == value_key(v) for k, v in base.items())]
    return hits[0] if hits else None


def _family(cells: pd.DataFrame, members: list[int], ref: int, role: str, margin: float = 0.0) -> dict:
    """The reference (marked with its role) and each member compared against it, as one Holm family."""
    comps = compare([cells.at[i, "values"] for i in members], cells.at[ref, "values"], margin)
    return {ref: role, **dict(zip(members, comps))}


def _equivalence(data: Data, ref: str, family: dict) -> str | None:
    """Which cells are shown equivalent to the reference within the ablation's margin, and which are not (why)."""
    margin = data.ablation.equivalence_margin
    tested = [(name, c) for name, c in ((_names(data)[i], c) for i, c in family.items())
              if isinstance(c, Comparison) and c.equiv is not None]
    if margin <= 0 or not tested:
        return None
    alike = [name for name, c in tested if c.equivalent]
    text = f"equivalent to {ref} within ±{margin:g} (TOST, Holm): " + (join(alike) if alike else "no cell")
    unshown = [(name, c) for name, c in tested if not c.equivalent]
    for why, cells in (("outside the margin", [(n, c) for n, c in unshown if abs(c.diff) >= margin]),
                       ("too much seed noise", [(n, c) for n, c in unshown if abs(c.diff) < margin])):
        if cells:  # the reason once; each cell's Δ and Holm p stand in the comparison table below
            text += f"; not shown equivalent, {why}: {', '.join(name for name, _ in cells)}"
    return text


def _vs_baseline(data: Data, base: int) -> tuple[Family, str]:
    """Every other cell against the baseline, and whether each beats it (the paper's claim for a baseline)."""
    cells, names = data.cells, _names(data)
    fam = _family(cells, [i for i in cells.index if i != base], base, "baseline", data.ablation.equivalence_margin)
    ref = names[base]
    if cells.at[base, "n"] == 0:
        return (ref, fam), f"every other cell beats {ref} (the paper's claim): cannot tell, {ref} has no finished run"
    groups = outcomes(names, fam)
    tested = sum(map(len, groups.values()))
    higher = groups.pop("higher", [])
    verdict = ("yes" if higher and len(higher) == tested else "contradicted" if "lower" in groups
               else "not shown" if tested else "cannot tell")
    text = (f"every other cell beats {ref} by more than seed noise (the paper's claim): {verdict}, "
            f"{len(higher)} of {tested} cells with runs do")
    missing = [names[i] for i in cells.index if i != base and cells.at[i, "n"] == 0]
    text += f" ({len(missing)} designed cells have no finished run)" if missing else ""
    return (ref, fam), text + (f"; {shortfall(groups, ref)}" if groups else "")


def _vs_best(data: Data, best: int, skip: set) -> tuple[Family, str]:
    """Every other cell (but those in skip) against the best one: which fall short of it."""
    cells, names = data.cells, _names(data)
    fam = _family(cells, [i for i in cells.index if i not in skip | {best}], best, "best",
                  data.ablation.equivalence_margin)
    groups = outcomes(names, fam)
    tested, lower = sum(map(len, groups.values())), groups.get("lower", [])
    text = (f"cells below the best cell {names[best]} by more than seed noise: "
            + (f"{listing(lower)} ({len(lower)} of {tested})" if lower else
               f"none of {tested} (no difference from the best shown, which is no proof that they are alike)"))
    return ("best", fam), text


def _replication(data: Data, families: list[Family]) -> tuple[Table, str]:
    """Each cell's verdict against the baseline here (families[0], from `_comparisons`) and in the other draw of
    the design (--compare-with)."""
    other, keys = data.other, list(data.profile.axes)
    ref, here = families[0]
    (_, there), _ = _vs_baseline(other, _baseline(other))
    theirs = {name: there.get(i) for i, name in _names(other).items()}
    draws = [f"seeds {fmt_seeds(p.seeds)}" for p in (data.profile, other.profile)]
    columns = [*map(label, keys)] + [x for d in draws for x in (f"Δ ({d})", "Holm p", "verdict")] + ["same"]
    table = Table(f"Verdicts against the baseline {ref}: this draw and {other.profile.name}'s", columns, [])
    agree, differ = 0, []
    for index, name in _names(data).items():
        mine, yours = here.get(index), theirs.get(name)
        if isinstance(mine, str):
            continue
        verdicts = [c.outcome if isinstance(c, Comparison) and c.n > 0 else "missing" for c in (mine, yours)]
        same = verdicts[0] == verdicts[1] and verdicts[0] != "missing"
        agree += same
        differ += [] if same else [f"{name} ({verdicts[0]} here, {verdicts[1]} there)"]
        line = [fmt_value(data.cells.at[index, k]) for k in keys]
        for comp, verdict in zip((mine, yours), verdicts):
            line += ([f"{comp.diff:+.4f}", fmt_p(comp.holm)] if verdict != "missing" else ["-", "-"]) + [verdict]
        table.rows.append(line + ["yes" if same else "no"])
    text = (f"the verdicts against {ref} replicate in {agree} of {len(table.rows)} cells in the other draw "
            f"({other.profile.name}, {draws[1]}, records in {data.other_source})")
    return table, text + (f"; they differ for {join(differ)}" if differ else "")


def _comparisons(data: Data) -> tuple[list[Family], list[str], str]:
    """The families a grid or compute table tests (vs the baseline, vs the best), their sentences, the Tests line."""
    cells = data.cells
    base, best = _baseline(data), _best(cells)
    families, seen, refs = [], [], []
    if base is not None:
        fam, text = _vs_baseline(data, base)
        families, seen, refs = [fam], [text], [f"the baseline {fam[0]}"]
    if best is not None and len(cells) - (base is not None) >= 2:
        fam, text = _vs_best(data, best, {base} if base is not None else set())
        families, seen, refs = families + [fam], seen + [text], refs + [BEST_REF]
    tests = TESTS.format(refs=" and, as a second family, against ".join(refs))
    tests += f"; {BEST_CAVEAT}" if BEST_REF in refs else ""
    return families, seen, tests if refs else "none: no finished runs to compare"


HIGH_NORM_KEY = "viz/high_norm_"  # artifact columns that `vit-ablate viz --into-record` adds to a record


def _artifacts(data: Data) -> str | None:
    """A sentence on the high-norm patch tokens an ablation's columns measure (registers), or None."""
    keys = [k for k in data.ablation.columns if k.startswith(HIGH_NORM_KEY)]
    if not keys:
        return None
    measured = [(i, k, v[0]) for k in keys for i, v in data.cells[k].items() if v[2] > 0]
    if not measured:
        return "high-norm tokens: not measured (run `vit-ablate viz RUN --into-record` on the runs, then the table)"
    index, key, worst = max(measured, key=lambda m: m[2])
    if worst == 0:
        return ("no run shows a single high-norm patch token in any layer measured: at this scale the artifact that "
                "registers remove does not appear, so this table cannot show their effect on it")
    return f"high-norm patch tokens appear: up to {worst:.1%} of them ({_names(data)[index]}, {data.ablation.columns[key]})"


def _drops(data: Data) -> dict[int, list[float]]:
    """Each cell's shuffle drops, one per averaged run that measured it."""
    runs = data.runs[data.runs["note"] == ""]
    return {i: [v for v in pd.to_numeric(runs[runs["cell"] == i][SHUFFLE_DROP], errors="coerce") if math.isfinite(v)]
            for i in data.cells.index}


def _use_groups(data: Data) -> tuple | None:
    """Each cell's position use, from its shuffle drop against the baseline's: (groups {kind: cell indices}, drop
    comparisons, accuracy comparisons, the baseline's mean drop); None when unmeasured. An encoding is called ignored
    only where its records state why the grid hides it (a distance bias too weak at this grid) and its accuracy does
    not beat the baseline's; elsewhere its use is 'not shown'."""
    base = _baseline(data)
    if SHUFFLE_DROP not in measured(data.ablation.columns, data.cells) or base is None:
        return None
    if not (drops := _drops(data))[base]:
        return None
    others = [i for i in data.cells.index if i != base and drops[i]]
    used = dict(zip(others, compare([drops[i] for i in others], drops[base])))
    accuracy = _family(data.cells, others, base, "baseline")
    groups: dict[str, list[int]] = {}
    for i in others:
        gain = accuracy[i].outcome if used[i].holm is not None and used[i].outcome == "higher" else None
        hidden = position_use.largest_bias(data, i) and accuracy[i].outcome != "higher"
        key = ("untested" if used[i].holm is None else ("ignored" if hidden else "unshown") if gain is None else
               {"higher": "helps", "lower": "lower"}.get(gain, "no gain"))
        groups.setdefault(key, []).append(i)
    return groups, used, accuracy, sum(drops[base]) / len(drops[base])


USE_WORDS = {"helps": "used, helps", "no gain": "used, gain not shown", "lower": "used, below {ref}",
             "untested": "not settled (n<2)"}


def _use_words(data: Data, use: tuple) -> dict[int, str]:
    """Each cell's position use in a few words, for the verdict grid."""
    groups, used, _, _ = use
    ref = _names(data)[_baseline(data)]
    at = position_use.grid(data, groups.get("ignored", []))
    words = {**{k: w.format(ref=ref) for k, w in USE_WORDS.items()},
             "ignored": f"ignored at a {at} grid" if at else "ignored"}
    out = {i: words[k] for k, cells in groups.items() if k != "unshown" for i in cells}
    return {**out, **{i: f"use not shown (Holm p {fmt_p(used[i].holm)})" for i in groups.get("unshown", [])}}


def _position_use(data: Data, use: tuple | None) -> str | None:
    """Which cells use position (a shuffle drop above the baseline's by more than seed noise), and whether that
    helps (accuracy above the baseline's): an encoding that is ignored from one that does not help. None: unmeasured."""
    if use is None:
        return None
    groups, used, accuracy, base_drop = use
    names = _names(data)
    ref = names[_baseline(data)]
    drop = lambda i: f"{names[i]} ({used[i].diff + base_drop:+.4f}"  # noqa: E731
    text = {  # each cell's drop, and what its verdict rests on
        "helps": lambda i: f"{drop(i)})",
        "no gain": lambda i: f"{drop(i)}; Holm p {fmt_p(accuracy[i].holm)})",
        "lower": lambda i: f"{drop(i)}; Holm p {fmt_p(accuracy[i].holm)})",
        "unshown": lambda i: f"{drop(i)}; Holm p {fmt_p(used[i].holm)})",
        "ignored": lambda i: f"{drop(i)}{position_use.largest_bias(data, i)})",
        "untested": lambda i: f"{drop(i)})"}
    at = f" at a {grid} grid" if (grid := position_use.grid(data, groups.get("ignored", []))) else ""
    parts = []
    for key, what in (("helps", "the encoding is used and helps"),
                      ("no gain", f"used; gain not shown (Holm p of its accuracy against {ref}'s; no proof that it "
                                  "does not help)"),
                      ("lower", f"used; accuracy below {ref}'s (Holm p of its accuracy against {ref}'s)"),
                      ("unshown", "use not shown (Holm p of the drops)"),
                      ("ignored", f"ignored{at}"),
                      ("untested", "no test (n<2)")):
        if key in groups:
            parts.append(f"{what}: {', '.join(map(text[key], groups[key]))}")
    return (f"position use ({position_use.weights_note(data)}; {ref}'s drop {base_drop:+.4f}): " + "; ".join(parts))


def _use_tests(data: Data, use: tuple) -> str:
    """How position use is read, the same for every panel: for the Tests line, with what else a shuffle changes."""
    groups = use[0]
    others = sorted(i for cells in groups.values() for i in cells)
    caveats = position_use.caveats(data, others, _names(data))
    return ("position use: each cell's shuffle drop (top-1 lost when each validation image's patches are permuted) "
            "against the baseline's (Welch, Holm); 'use not shown': the drop within seed noise of the baseline's; "
            "'ignored at an NxN grid': a distance bias that spans few logits at that grid, the drop within seed noise "
            "of the baseline's and the accuracy not above it"
            + (f"; what else a shuffle changes: {'; '.join(caveats)}" if caveats else ""))


# ---- the layouts --------------------------------------------------------------------------------

def build_grid(data: Data) -> Report:
    """Rows x cols beside the paper (like Table 8), then every cell against the baseline and the best (per panel)."""
    ab, cells, keys = data.ablation, data.cells, list(data.profile.axes)
    tables: list[Table] = []
    two_d = bool(ab.cols) and set(keys) == {ab.rows, ab.cols}
    if two_d:
        own = getattr(ab, "col_label", None) or (lambda cell: None)
        frame = cells.assign(row=cells[ab.rows].map(fmt_value),
                             col=[own({k: c[k] for k in keys}) or fmt_value(c[ab.cols]) for _, c in cells.iterrows()])
        if ab.panel:
            frame["best"] = pd.concat([best_of(part) for _, part in frame.groupby(ab.panel, sort=False)])
        caption = "Ours beside the paper" + (f" (bold: the best of each {label(ab.panel)})" if ab.panel else "")
        tables.append(grid_table(frame, label(ab.rows), caption, _unique(frame["row"]), _unique(frame["col"])))
    seen, tests, asked, stds = [], "none: no finished runs to compare", [], {}
    for name, part in _panels(data):
        part_tables, part_seen, part_tests = _grid_tests(part, two_d)
        if expected := ab.expected.get(name.partition("=")[2]):
            part_seen.insert(0, f"expected: {expected}")
        tables += [dataclasses.replace(t, caption=f"{name}: {t.caption}") if name else t for t in part_tables]
        seen += [f"{name}: {line}" if name else line for line in part_seen]
        tests = part_tests if part_tests.startswith("Welch") else tests
        asked += _questions(part, name)
        stds.update({f"{n} ({name.partition('=')[2]})" if name else n: (part.cells.at[i, "std"], part.cells.at[i, "n"])
                     for i, n in _names(part).items()})
    rows = _unique(n for p in _panels(data) for n in _names(p[1]).values())
    note = verdicts.margin_note(ab.equivalence_margin, ab.equivalence_note, stds)
    return report(data, tables, tests, "; ".join(seen) or "cannot tell: no finished runs", extrapolation.figures(data),
                  verdicts=verdicts.grid(rows, asked), notes=[note] if note else [])


def _questions(data: Data, panel: str) -> list[tuple[str, dict[str, str]]]:
    """One grid's (or panel's) verdict columns: against the baseline (else the best), the expected verdict where
    the ablation states one, and position use where the shuffle drop is measured."""
    ab, cells, names = data.ablation, data.cells, _names(data)
    families, _, _ = _comparisons(data)
    if not families:
        return []
    ref, fam = families[0]
    ref_index = next(i for i, c in fam.items() if isinstance(c, str))
    ref = "/".join(map(fmt_value, ab.baseline.values())) if ref != "best" else "the best"
    means = lambda i: (cells.at[i, "mean"], cells.at[ref_index, "mean"])  # noqa: E731
    prefix = f"{panel.partition('=')[2]}: " if panel else ""
    # a cell still rising at the end of its budget is flagged, not ranked (settle.py); its reference keeps its role
    rising = settle.still_rising(data) if getattr(data.profile, "settle", False) else set()
    out = [(f"{prefix}vs {ref}", {names[i]: verdicts.RISING if i in rising and not isinstance(c, str) else
                                  verdicts.versus(c, ref, means(i), ab.equivalence_margin, ab.chance)
                                  for i, c in fam.items()})]
    if expected := ab.expected_verdicts.get(panel.partition("=")[2]):
        wanted = {n: expected.get(n, expected.get("*") if i != ref_index else None) for i, n in names.items()}
        out.append((f"{prefix}expected", {n: w for n, w in wanted.items() if w}))
    if use := _use_groups(data):
        out.append((f"{prefix}position use", {names[_baseline(data)]: "baseline",
                                              **{names[i]: w for i, w in _use_words(data, use).items()}}))
    return out


def _panels(data: Data) -> list[tuple[str, Data]]:
    """('', data) without a panel key; else one ('task=absolute', its cells and runs) per value, in design order."""
    key = data.ablation.panel
    if key is None:
        return [("", data)]
    # within a panel its key is one value: the cells are named and listed by the other keys
    grids = tuple({k: v for k, v in block.items() if k != key} for block in data.profile.grids)
    profile = dataclasses.replace(data.profile, grids=grids)
    out = []
    for value in _unique(data.cells[key].map(value_key)):
        cells = data.cells[data.cells[key].map(value_key) == value].copy()
        cells["best"] = best_of(cells)
        runs = data.runs[data.runs["cell"].isin(cells.index)]
        name = f"{label(key)}={fmt_value(cells[key].iloc[0])}"
        out.append((name, dataclasses.replace(data, profile=profile, cells=cells, runs=runs, other=None)))
    return out


def _grid_tests(data: Data, two_d: bool) -> tuple[list[Table], list[str], str]:
    """A grid's (or one panel's) comparison table, resolution view and position use: tables, sentences, tests."""
    ab, keys = data.ablation, list(data.profile.axes)
    families, seen, tests = _comparisons(data)
    refs = [f"the baseline {n}" if n != "best" else "the best cell" for n, _ in families]
    caption = f"Each cell against {' and against '.join(refs)}" if refs else "Each cell"
    wide, extra = further.columns(data)
    tables = [comparison_table(wide, keys, caption, families, paper=not two_d and data.cells["paper"].notna().any(),
                               extra=extra, margin=ab.equivalence_margin)]
    seen += [text for name, fam in families if (text := _equivalence(data, name, fam))]
    if paired := pairs.pair_table(data, _names(data)):
        tables, seen = tables + [paired[0]], seen + [paired[1]]
    tables += resolution_tables(data, _names(data))  # its caption says what it is: no sentence points to it
    if drift := extrapolation.drift_line(data):
        seen.append(drift)
    if data.other is not None:
        table, text = _replication(data, families)
        tables, seen = tables + [table], seen + [text]
    if artifacts := _artifacts(data):
        seen.append(artifacts)
    groups = _use_groups(data)
    if use := _position_use(data, groups):
        seen.append(use)
    if ab.equivalence_margin > 0 and tests.startswith("Welch"):
        tests += "; " + EQUIVALENCE.format(margin=ab.equivalence_margin)
    if use and tests.startswith("Welch"):
        tests += "; " + _use_tests(data, groups)
    return tables, seen, tests


def build_compute(data: Data) -> Report:
    """Accuracy and compute per cell, tested against the best, and accuracy against GFLOPs per image."""
    ab, cells, keys = data.ablation, data.cells, list(data.profile.axes)
    families, seen, tests = _comparisons(data)
    names = _names(data)
    done = cells[(cells["n"] > 0) & cells["gflops_per_image"].notna()].sort_values("gflops_per_image", kind="stable")
    if len(done) >= 2:
        cheap, dear = done.index[0], done.index[-1]
        comp = compare([cells.at[dear, "values"]], cells.at[cheap, "values"])[0]
        rises = "yes" if done["mean"].is_monotonic_increasing else "no"
        verdict = {"higher": "reproduced", "lower": "not reproduced, it is lower", "not shown": "not shown",
                   "no test (n<2)": "cannot tell (n<2)"}[comp.outcome]
        seen.insert(0, f"cell means rise with GFLOPs per image: {rises}; the costliest cell {names[dear]} beats the "
                       f"cheapest {names[cheap]} by more than seed noise (the paper's 'more compute, higher "
                       f"accuracy'): {verdict} ({comp.diff:+.4f}, Welch p={fmt_p(comp.p)}, one test)")
    tables = [comparison_table(cells, keys, "Accuracy and compute per cell", families,
                               paper=cells["paper"].notna().any())]
    if ab.rows == PATCH and (transfer := transfer_tables(data)):
        tables += transfer
        seen.append("the patch-size transfer view below: each trained patch size evaluated at the others")
    if data.other is not None:
        table, text = _replication(data, families)
        tables, seen = tables + [table], seen + [text]
    series = [("ours", done["gflops_per_image"].tolist(), done["mean"].tolist(), done["std"].fillna(0).tolist(),
               "o-")] if len(done) else []
    draw = lambda p: plots.line_plot(p, series, "GFLOPs per image", ab.metric, "Accuracy vs compute",  # noqa: E731
                                     logx=True, annotate={"ours": [names[i] for i in done.index]})
    return report(data, tables, tests, "; ".join(seen) or "cannot tell: no finished runs",
                  [("accuracy_vs_compute.png", "accuracy vs GFLOPs per image", draw)],
                  verdicts=verdicts.grid(list(names.values()), _questions(data, "")))


def build_lr_sweep(data: Data) -> Report:
    """Accuracy per learning rate per set-up; each set-up at its own best lr, with a fitted optimum and interval."""
    lr = data.ablation.cols
    setup = [k for k in data.profile.axes if k != lr]
    cells = data.cells.assign(row=data.cells[lr].map(fmt_value), col=[cell_name(c, setup) for _, c in
                                                                       data.cells.iterrows()])
    groups = _unique(cells["col"])
    bests = {g: _best(cells[cells["col"] == g]) for g in groups}
    cells["best"] = cells.index.isin([b for b in bests.values() if b is not None])
    rows = [fmt_value(v) for v in sorted(set(cells[lr]))]
    corner = "/".join(map(label, setup))
    tables = [grid_table(cells, label(lr), f"Accuracy per {label(lr)} (bold: each {corner}'s best)", rows, groups)]
    fits = {g: _fit(cells[(cells["col"] == g) & (cells["n"] > 0)], lr, seed) for seed, g in enumerate(groups)}
    table, seen, comps = _own_best(cells, lr, corner, bests, fits)
    seen = "; ".join([seen, *_shown_shift(data.ablation, fits)])
    grid = verdicts.grid(groups, _lr_questions(cells, lr, bests, comps, fits))
    tables.append(table)
    tests = (f"Welch's t-test (two-sided, scipy ttest_ind with equal_var=False) of each {corner} at its own best "
             f"{label(lr)} against the best of them, Holm-corrected; fitted optimum: the peak of a parabola in "
             f"log10({label(lr)}) through the best grid point and its two neighbours, with a 95% interval "
             f"from 2000 parametric bootstrap draws (each cell's mean plus Student's t with n-1 degrees of freedom "
             f"times its standard error; by simulation it covers the optimum at least 95% of the time at n = 3 "
             f"and 5); optima differ when the interval of their ratio "
             f"excludes 1; Figure 9's observable, each other {corner} at the first one's best {label(lr)} against "
             f"itself at its own best, and the first at each other's: one Welch test each, uncorrected; {BEST_CAVEAT}")
    figures = [("lr_curve.png", f"accuracy vs {label(lr)} per {corner}", lambda p: _lr_curve(data, cells, lr, p)),
               ("training_curves.png", "validation accuracy per epoch",
                lambda p: _training_curves(data, cells, lr, bests, p))]
    return report(data, tables, tests, seen, figures, verdicts=grid)


def _lr_questions(cells: pd.DataFrame, lr: str, bests: dict, comps: dict, fits: dict) -> list:
    """Each set-up's verdicts: at its own best lr against the best set-up, and where its fitted optimum lies."""
    top = [g for g, b in bests.items() if b is not None and g not in comps]
    own = {g: "no runs" if b is None else "the best" if g in top else verdicts.versus(comps[g], "the best", (
        cells.at[b, "mean"], math.nan), 0.0, None) for g, b in bests.items()}
    optimum = {g: "not settled (fewer than 3 lrs)" if f is None else
               f"{fmt_lr(f.lr)}" + (", at the grid's edge" if f.edge else "")
               + (f" ({fmt_lr(f.low)} to {fmt_lr(f.high)})" if f.low else " (no interval: n<2)")
               for g, f in fits.items()}
    return [(f"at its own best {label(lr)}", own), (f"fitted optimal {label(lr)} (95% interval)", optimum)]


def _fit(done: pd.DataFrame, lr: str, seed: int) -> Optimum | None:
    """The fitted optimum of one set-up's finished cells; None with fewer than three learning rates.

    Each set-up bootstraps with its own generator seed, so two set-ups' draws are independent.
    """
    done = done.sort_values(lr)
    return optimum(done[lr].tolist(), done["values"].tolist(), seed) if len(done) >= 3 else None


def _own_best(cells: pd.DataFrame, lr: str, corner: str, bests: dict, fits: dict) -> tuple[Table, str, dict]:
    """The table of each set-up at its own best lr, and the sentences saying what it shows."""
    found = {g: b for g, b in bests.items() if b is not None}
    top = max(found, key=lambda g: (cells.at[found[g], "mean"], -list(found).index(g))) if found else None
    rivals = [g for g in found if g != top]
    comps = dict(zip(rivals, compare([cells.at[found[g], "values"] for g in rivals],
                                     cells.at[found[top], "values"]))) if top is not None else {}
    table = Table(f"Each {corner} at its own best {label(lr)}",
                  [corner, f"best {label(lr)}", "accuracy", "fitted optimum", "95% interval", "Δ vs best", "p",
                   "Holm p"], [])
    for g, b in bests.items():
        fit = fits[g]
        cell = cells.loc[b] if b is not None else None
        line = [g, fmt_value(cell[lr]), fmt_acc(cell["mean"], cell["std"], cell["n"])] if b is not None \
            else [g, "-", "missing"]
        line += [fmt_lr(fit.lr), f"{fmt_lr(fit.low)} to {fmt_lr(fit.high)}" if fit.low else "-"] if fit else ["-", "-"]
        line += comparison_text("best" if g == top else comps.get(g, "-"))
        if g == top:
            table.bold.add((len(table.rows), 2))
        table.rows.append(line)
    return table, _lr_verdict(cells, lr, found, top, comps, fits), comps


def _lr_verdict(cells, lr, found: dict, top, comps: dict, fits: dict) -> str:
    """What the lr sweep shows: accuracy at each one's best lr, the fitted optima, whether the optima differ."""
    if len(found) < 2:
        return "cannot tell: fewer than two set-ups have finished runs"
    own = ", ".join(f"{g} {cells.at[b, 'mean']:.4f} at {label(lr)} {fmt_value(cells.at[b, lr])}"
                    for g, b in found.items())
    lower = [(g, c) for g, c in comps.items() if c.outcome == "lower"]
    untested = [g for g, c in comps.items() if c.holm is None]
    acc = (f"below {top} by more than seed noise for {listing(lower)}" if lower else
           f"cannot tell for {join(untested)} (n<2)" if untested else
           f"no difference from {top} shown ({', '.join(f'{g} Holm p={fmt_p(c.holm)}' for g, c in comps.items())}"
           f"; no proof of equal accuracy)")
    parts = [f"each at its own best {label(lr)}: {own}; accuracy: {acc}", *_at_others_best(cells, lr, found)]
    optima = [f"{g} {fmt_lr(f.lr)}" + (f" ({fmt_lr(f.low)} to {fmt_lr(f.high)})" if f.low else " (no interval: n<2)")
              for g, f in fits.items() if f]
    unfit = [g for g, f in fits.items() if f is None]
    edge = [g for g, f in fits.items() if f and f.edge]
    parts.append((f"fitted optimal {label(lr)} (95% interval): {', '.join(optima)}" if optima else
                  f"fitted optimal {label(lr)} (95% interval): none")
                 + (f"; cannot fit {join(unfit)}: fewer than 3 learning rates with finished runs" if unfit else "")
                 + (f"; the best grid point of {join(edge)} is at the grid's edge, so the optimum may lie outside"
                    if edge else ""))
    fitted = [g for g in found if fits[g]]
    for g in fitted[1:]:
        point, low, high = ratio(fits[g], fits[fitted[0]])
        interval = f", 95% interval {low:.3g} to {high:.3g}" if low is not None else ""
        parts.append(f"the optima of {g} and {fitted[0]} differ: {differ(fits[g], fits[fitted[0]])} "
                     f"(ratio {point:.2g}{interval})")
    return "; ".join(parts)


def _shown_shift(ab, fits: dict) -> list[str]:
    """Whether each fitted optima's ratio excludes the ratio of the learning rates the paper's figure shows for the
    same two set-ups (Ablation.shown_lrs): two lrs it shows, not optima it located."""
    figure, shown = ab.shown_lrs or ("", {})
    fitted = [g for g, f in fits.items() if f and g in shown]
    lines = []
    for g in fitted[1:]:
        _, low, high = ratio(fits[g], fits[fitted[0]])
        if low is None:
            continue
        theirs = shown[g] / shown[fitted[0]]
        lines.append(f"the interval of the optima's ratio {g} / {fitted[0]} ({low:.3g} to {high:.3g}) "
                     + ("excludes" if not low <= theirs <= high else "does not exclude")
                     + f" a shift as large as the learning rates {figure} shows ({fmt_value(shown[g])} vs "
                     f"{fmt_value(shown[fitted[0]])}; two lrs it plots, not optima it located)")
    return lines


def _at_others_best(cells: pd.DataFrame, lr: str, found: dict) -> list[str]:
    """Figure 9's observable: every other set-up at the first one's best lr against itself at its own best, and
    the first at each other's best lr against itself at its own (one Welch test each)."""
    first, others = next(iter(found)), list(found)[1:]
    lines = []
    for who, whose in [(g, first) for g in others] + [(first, g) for g in others]:
        own, shared = found[who], cells.at[found[whose], lr]
        at = cells[(cells["col"] == who) & (cells[lr] == shared) & (cells["n"] > 0)]
        head = f"{who} at {whose}'s best {label(lr)} ({fmt_value(shared)}) vs at its own ({fmt_value(cells.at[own, lr])})"
        if at.index.empty or at.index[0] == own:
            lines.append(f"{head}: " + ("the same lr, its own best" if len(at) else "no finished run there"))
            continue
        comp = compare([cells.at[at.index[0], "values"]], cells.at[own, "values"])[0]
        verdict = {"lower": "lower by more than seed noise", "higher": "higher by more than seed noise",
                   "not shown": "no difference shown"}.get(comp.outcome, comp.outcome)
        lines.append(f"{head}: {cells.at[at.index[0], 'mean']:.4f} vs {cells.at[own, 'mean']:.4f} "
                     f"({comp.diff:+.4f}, Welch p={fmt_p(comp.p)}, {verdict})")
    return lines


# ---- figures ------------------------------------------------------------------------------------

def _lr_curve(data: Data, cells: pd.DataFrame, lr: str, path) -> None:
    """Accuracy vs learning rate, one line per set-up, error bars = sample std (0 for n=1)."""
    done, series = cells[cells["n"] > 0], []
    for name, g in done.groupby("col", sort=False):
        g = g.sort_values(lr)
        series.append((name, g[lr].tolist(), g["mean"].tolist(), g["std"].fillna(0).tolist(), "o-"))
    plots.line_plot(path, series, label(lr), data.ablation.metric, f"Accuracy vs {label(lr)}", logx=True)


def _mean_curve(data: Data, index: int, metric: str = "val/acc") -> tuple[list[float], list[float]]:
    """Epochs and the seed-mean of metric over a cell's finished runs' histories."""
    runs = data.runs
    names = runs[(runs["note"] == "") & (runs["cell"] == data.cells.at[index, "cell"])]["name"]
    rows = [h for name in names for h in data.history.get(name, []) if metric in h]
    if not rows:
        return [], []
    curve = pd.DataFrame(rows).groupby("epoch")[metric].mean()
    return [float(e) for e in curve.index], curve.tolist()


def _training_curves(data: Data, cells: pd.DataFrame, lr: str, bests: dict, path) -> None:
    """Each set-up at its own best lr (solid) and at the first set-up's best lr (dashed), like Figure 9."""
    found = {g: b for g, b in bests.items() if b is not None}
    shared = cells.at[next(iter(found.values())), lr] if found else None
    series = []
    for g, b in found.items():
        picks = [(b, "best", "-")]
        other = cells[(cells["col"] == g) & (cells[lr] == shared) & (cells["n"] > 0)]
        if cells.at[b, lr] != shared and len(other):
            picks.append((other.index[0], f"{next(iter(found))}'s best", "--"))
        for index, why, style in picks:
            x, y = _mean_curve(data, index)
            if x:
                series.append((f"{g}, {label(lr)}={fmt_value(cells.at[index, lr])} ({why})", x, y, None, style))
    plots.line_plot(path, series, "epoch", "val/acc", "Validation accuracy per epoch", integer_x=True)


BUILDERS: dict[str, Callable[[Data], Report]] = {"grid": build_grid, "lr_sweep": build_lr_sweep,
                                                  "compute": build_compute}
