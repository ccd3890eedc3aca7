"""Run records -> pandas: one row per run (runs.csv), then one row per designed cell (the tables)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from vit_lightning.ablation import selector
from vit_lightning.core.identity import number, plain, same
from vit_lightning.core.names import SEED_KEY
from vit_lightning.model.position import ENCODING_OPTIONS, trained_options
from vit_lightning.records.checked import SKIPPED
from vit_lightning.records.stats import summarize
from vit_lightning.records.store import record_time

SEED = SEED_KEY
COMPUTE = ("params", "gflops_per_image", "train_images_per_s", "wall_s")
UNFINISHED = {"failed": "did not finish", "diverged": "did not finish (non-finite loss)",
              "running": "unfinished (still running, or killed)"}


def cell_index(cells: list[dict], config: dict) -> int:
    """Which designed cell a run's config belongs to; -1 if none."""
    return next((i for i, c in enumerate(cells) if all(k in config and same(v, config[k]) for k, v in c.items())), -1)


def design_cells(profile: Any) -> list[dict]:
    """The profile's cells (axis values, no seed) with JSON-plain values."""
    return [plain(cell) for cell in profile.cells()]


def _why_not_used(rec: dict, cell: int, metric: float, profile: Any, metric_name: str = "") -> str:
    """Why a record is not averaged into its cell ('' when it is)."""
    status = rec.get("status")
    if status == "stopped_early":  # by its sweep's hyperband rule: a shorter run is no finished one
        return f"stopped early ({rec.get('stopped_early') or 'hyperband'})"
    if status != "completed":
        return UNFINISHED.get(status, f"status {status!r}")
    config = rec.get("config", {})
    changed = [f"{k}={config[k]!r} (profile: {v!r})" for k, v in sorted(profile.fixed.items())
               if not k.startswith("run.") and k in config and not same(v, config[k]) and not selector(v)]
    model = {k.removeprefix("model."): v for k, v in config.items() if k.startswith("model.")}
    for key, then in trained_options(model).items():  # an option recorded since: the run trained with its old value
        now = profile.fixed.get(f"model.{key}", ENCODING_OPTIONS.get(key))
        if key not in model and not same(then, now):
            changed.append(f"model.{key}={then!r} (trained before the option was recorded; now: {now!r})")
    if changed:
        return "settings differ from the profile: " + ", ".join(changed)
    if cell < 0 and not getattr(profile, "search", None):  # a searched profile's points are its own
        return "not a designed cell"
    problems = rec.get(SKIPPED) or []
    why = [p for p in problems if p.startswith(f"metrics[{metric_name!r}]")]
    if not math.isfinite(metric):
        return f"no metric ({why[0]})" if why else "no metric"
    return f"unreadable: {'; '.join(problems)}" if problems else ""  # NaN anywhere: none of its numbers are used


def runs_frame(ablation: Any, profile: Any, records: list[dict]) -> pd.DataFrame:
    """One row per record of this profile: name, status, swept keys, seed, metric, compute, used/note."""
    cells, keys = design_cells(profile), list(profile.axes)
    extra, replicates = list(getattr(ablation, "columns", {})), getattr(ablation, "replicates", None)
    rows = []
    for rec in records:
        if rec.get("profile") != profile.name or rec.get("ablation", ablation.name) != ablation.name:
            continue
        config, metrics, compute = rec.get("config", {}), rec.get("metrics") or {}, rec.get("compute") or {}
        index = cell_index(cells, config)
        cell = cells[index] if index >= 0 else {k: plain(config.get(k)) for k in keys}
        metric = math.nan if metrics.get(ablation.metric) is None else float(metrics[ablation.metric])
        rows.append({"name": rec["name"], "status": rec.get("status"), **cell, "seed": config.get(SEED),
                     "replicate": plain(config.get(replicates)) if replicates else None,
                     "val/acc": metrics.get("val/acc"), ablation.metric: metric,
                     **{m: number(metrics.get(m)) for m in extra},
                     **{k: compute.get(k) for k in COMPUTE}, "cell": index,
                     "note": _why_not_used(rec, index, metric, profile, ablation.metric),
                     "error": (rec.get("error") or "").splitlines()[0][:200] if rec.get("error") else "",
                     "time": record_time(rec)})
    columns = ["name", "status", *keys, "seed", *(["replicate"] if replicates else []), ablation.metric, *extra,
               "val/acc", *COMPUTE, "cell", "note", "error", "time"]
    frame = pd.DataFrame(rows, columns=list(dict.fromkeys(columns)))
    frame = frame.drop(columns=[m for m in extra if m in frame and frame[m].isna().all()])  # no record holds it yet
    frame["seed"] = pd.to_numeric(frame["seed"], errors="coerce").round().astype("Int64")
    by = keys if getattr(profile, "search", None) else ["cell"]  # a search's points are no designed cells
    frame = _mark_superseded(frame, [*by, "seed", *(["replicate"] if replicates else [])])
    order = frame["cell"].where(frame["cell"] >= 0, len(cells))
    frame = frame.assign(_order=order).sort_values(["_order", "seed", "name"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


def _mark_superseded(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Two finished runs of one cell and seed (and replicate; e.g. an older config hash): keep the newer one."""
    used = frame[frame["note"] == ""].sort_values(["time", "name"])
    dup = used.duplicated(key, keep="last")
    for i in used.index[dup]:
        same_key = (used[key].astype(str) == used.loc[i, key].astype(str)).all(axis=1)
        newer = used[same_key]["name"].iloc[-1]
        frame.at[i, "note"] = f"superseded by {newer}"
    return frame


def standing_runs(runs: pd.DataFrame, n_cells: int) -> list[list[str]]:
    """Per designed cell, the runs the table averages, lowest seed first: the first that has a checkpoint stands
    for the cell in figures."""
    used = runs[runs["note"] == ""]
    return [used[used["cell"] == index]["name"].tolist() for index in range(n_cells)]


def cell_frame(ablation: Any, profile: Any, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per designed cell: swept keys, values, n, mean, std (ddof=1), compute means, best."""
    used = runs[runs["note"] == ""]
    rows = []
    for index, cell in enumerate(design_cells(profile)):
        mine = used[used["cell"] == index]
        values = mine[ablation.metric].tolist()
        mean, std, n = summarize(values)
        compute = {k: pd.to_numeric(mine[k], errors="coerce").mean() for k in COMPUTE}
        extra = {}
        for m in getattr(ablation, "columns", {}):  # (mean, std, n) of each further metric (none: no record has it)
            held = pd.to_numeric(mine[m], errors="coerce") if m in mine else []
            extra[m] = summarize([v for v in held if math.isfinite(v)])
        rows.append({"cell": index, **cell, "values": values, "n": n, "mean": mean, "std": std, **compute, **extra,
                     "paper": paper_value(ablation, cell, profile)})
    cells = pd.DataFrame(rows)
    return with_best(cells)


def with_best(cells: pd.DataFrame) -> pd.DataFrame:
    """Mark the highest-mean cell (first on ties)."""
    cells = cells.reset_index(drop=True)
    cells["best"] = best_of(cells)
    return cells


def best_of(cells: pd.DataFrame) -> pd.Series:
    """True at the highest-mean finished cell of these (first on ties), on their own index."""
    done = cells[cells["n"] > 0]
    return pd.Series(cells.index == (done["mean"].idxmax() if not done.empty else None), index=cells.index)


def paper_value(ablation: Any, cell: dict, profile: Any = None) -> float | str | None:
    """The paper's number for a cell: reference[(row, col)], else reference[row] (the profile's own reference, if
    it has one: other papers' numbers, a number or a text)."""
    row = cell.get(ablation.rows)
    col = cell.get(ablation.cols) if ablation.cols else None
    own = getattr(profile, "reference", None)
    ref = ablation.reference if own is None else own
    for key in ((row, col), row):
        try:
            if key in ref:
                return ref[key] if isinstance(ref[key], str) else float(ref[key])
        except TypeError:  # unhashable (list-valued) cell values have no reference
            return None
    return None
