"""Run records: collect them from runs/, keep them under results/, and fetch them from W&B sweeps or projects."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vit_lightning.core.files import write_atomic
from vit_lightning.core.identity import flatten, number, plain
from vit_lightning.core.names import FINAL, RECORD, SUMMARY_FIELDS
from vit_lightning.records.checked import checked
from vit_lightning.run.rundir import record_bytes, run_dirs

# W&B run state -> our record status, for runs whose summary has no final status (W&B has no "diverged")
WANDB_STATES = {"finished": "completed", "running": "running", "pending": "running",
                "crashed": "failed", "failed": "failed", "killed": "failed",
                "preempting": "failed", "preempted": "failed"}


def dump(record: dict) -> bytes:
    """A record as stable JSON text (sorted keys), for records we build ourselves."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def record_time(record: dict) -> float:
    """When a record was last written (seconds since the epoch; 0 if unknown), for newer-wins merging."""
    times = [0.0]
    for key in ("started_at", "finished_at", "updated_at"):  # updated_at: eval or viz --into-record added to it
        try:
            t = datetime.fromisoformat(str(record.get(key)).replace("Z", "+00:00"))
        except ValueError:
            continue
        times.append((t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp())
    return max(times)


def rank(record: dict) -> tuple:
    """Which of two records of one run to keep: a finished one, then the run's own (not a W&B copy), then the newer."""
    return record.get("status") in FINAL, record.get("source") != "wandb", record_time(record)


def slots(records_dir: Path, record: dict) -> list[Path]:
    """Where a record may be stored: <name>.json, or <name>.<ablation>.<profile>.json when another ablation's or
    profile's record of the same trial name holds the first (a record belongs to its ablation, profile and trial)."""
    name = str(record.get("name", ""))
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"run record has a bad name {name!r}")
    return [records_dir / f"{name}.json", records_dir / f"{name}.{record.get('ablation')}.{record.get('profile')}.json"]


def _owner(record: dict) -> tuple:
    return record.get("ablation"), record.get("profile")


def stored_record(records_dir: Path, record: dict) -> tuple[Path, dict | None]:
    """The file that holds (or would hold) this record's (ablation, profile, trial), and what it holds now."""
    free = None
    for dest in slots(Path(records_dir), record):
        if not dest.exists():
            free = free or dest
            continue
        try:
            stored = json.loads(dest.read_text())
        except (OSError, ValueError):
            stored = None  # a truncated copy: the run's own record replaces it
        if not isinstance(stored, dict) or _owner(stored) == _owner(record):
            return dest, stored if isinstance(stored, dict) else None
    if free is None:
        raise ValueError(f"{records_dir}: no free file for record {record.get('name')!r}")
    return free, None


def same_run(a: dict, b: dict) -> bool:
    """Two records of one run: the run keeps its start time through resumes, evaluations and its W&B copy."""
    return a.get("started_at") is not None and a.get("started_at") == b.get("started_at")


def store(records_dir: Path, record: dict, data: bytes | None = None, replace: bool = False) -> str:
    """Save a record under its (ablation, profile, trial); what happened: 'added', 'updated' (the same run, newer
    or finished since), 'replaced' (another run's record: an unfinished one, or any with `replace`), 'kept' (another
    run's finished record stays: `replace` not given), or '' (the stored record ranks as high)."""
    dest, stored = stored_record(records_dir, record)
    if stored is None:
        action = "added" if not dest.exists() else "replaced"
    elif same_run(stored, record):
        action = "updated" if rank(record) > rank(stored) else ""
    elif replace:
        action = "replaced" if rank(record)[:2] >= rank(stored)[:2] else ""
    elif rank(record) <= rank(stored):
        action = ""
    else:
        action = "kept" if stored.get("status") in FINAL else "replaced"
    if action in ("added", "updated", "replaced"):
        write_atomic(dest, data if data is not None else dump(record))
    return action


def collect(runs_root: Path, ablation: str, profile: str, records_dir: Path, replace: bool = False) -> dict[str, str]:
    """Copy runs/<ablation>/<profile>/*/results.json into records_dir (JSON only); {name: action} of each record
    added, updated, replaced or kept (see `store`)."""
    done = {}
    for directory in run_dirs(Path(runs_root) / ablation / profile):
        path = directory / RECORD
        try:
            data = record_bytes(directory)
            record = json.loads(data)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            if action := store(records_dir, record, data, replace):  # a byte copy: exactly as the run wrote it
                done[record["name"]] = action
        except (OSError, ValueError, AttributeError) as err:  # half-copied by hand, or not a record at all
            print(f"vit-ablate table: skipping {path}: {err}", file=sys.stderr)
    return done


def load_records(records_dir: Path, quiet: bool = False) -> list[dict]:
    """Every readable record in records_dir, sorted by name, through the checks of checked.py; an unreadable one
    is skipped with a message, and so is each malformed entry (`quiet`: said already by an earlier read)."""
    out = []
    warn = (lambda line: None) if quiet else _warn
    for path in sorted(Path(records_dir).glob("*.json")):
        if (record := _read_stored(path, warn)) is not None and (record := checked(record, path, warn)) is not None:
            out.append(record)
    return out


def _warn(line: str) -> None:
    print(f"vit-ablate table: {line}", file=sys.stderr)


def _read_stored(path: Path, warn) -> dict | None:
    """A stored record; None (and one line naming the file) when it is truncated or no record."""
    try:
        record = json.loads(path.read_text())
        if isinstance(record, dict):
            return record
        problem = "not a JSON object"
    except (OSError, ValueError) as err:
        problem = " ".join(str(err).split())
    warn(f"skipping {path}: unreadable ({problem}); delete it, or collect it again from the run's results.json")
    return None


# ---- W&B ------------------------------------------------------------------------------------------

def _history(rows: Iterable[dict]) -> list[dict]:
    """W&B history rows -> one dict per epoch (the epoch's last logged value of each metric)."""
    epochs: dict[int, dict] = {}
    for row in rows:
        if number(row.get("epoch")) is None:
            continue
        epoch = int(row["epoch"])
        entry = epochs.setdefault(epoch, {"epoch": epoch})
        for key, value in row.items():
            if not key.startswith(("_", "trainer/")) and key != "epoch" and number(value) is not None:
                entry[key] = number(value)
    return [epochs[e] for e in sorted(epochs)]


def from_wandb_run(run: Any, ablation: str, profile: str, sweep_id: str | None = None) -> dict:
    """Map a wandb.apis.public.Run (config, summary, history) to our run record schema.

    `fit` mirrors its record into the run's summary (loggers.summary): the metrics, compute/* facts,
    status, trial id and times; runs logged otherwise fall back on W&B's own state and timestamps.
    """
    config = flatten(dict(run.config))
    raw = dict(run.summary_metrics)
    summary = {k: v for k, v in raw.items() if not str(k).startswith("_") and k not in SUMMARY_FIELDS}
    numbers = {k: number(v) for k, v in summary.items() if number(v) is not None}
    metrics = {k: v for k, v in numbers.items() if not k.startswith("compute/")}
    diverged = any(not math.isfinite(v) for k, v in metrics.items() if "loss" in k)
    metrics = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}  # keep the JSON strict
    compute = {k.split("/", 1)[1]: plain(v) for k, v in summary.items() if k.startswith("compute/")}
    if "_runtime" in raw:
        compute.setdefault("wall_s", number(raw["_runtime"]))
    status = raw.get("status") if raw.get("status") in FINAL else WANDB_STATES.get(str(run.state).lower(), "failed")
    if status == "completed" and diverged:
        status = "diverged"
    return {
        "schema": 1,
        "name": raw.get("trial") or run.name or run.id,
        "ablation": config.get("run.ablation", ablation),
        "profile": config.get("run.profile", profile),
        "status": status,
        "config": config,
        "metrics": metrics,
        "history": _history(run.scan_history()),
        "compute": compute,
        "versions": {},
        "wandb": {"run_id": run.id, "sweep_id": sweep_id, "project": run.project},
        "error": None if status != "failed" else raw.get("error") or f"W&B state {run.state}",
        "started_at": raw.get("started_at") or getattr(run, "created_at", None),
        "finished_at": (raw.get("finished_at") or getattr(run, "heartbeat_at", None)) if status != "running" else None,
        "source": "wandb",
    }


def wandb_runs(path: str, ablation: str, api: Any) -> list[tuple[Any, str | None]]:
    """(run, sweep id) of ENTITY/PROJECT/SWEEP_ID, or of the runs of ENTITY/PROJECT tagged with the ablation."""
    parts = path.split("/")
    if len(parts) == 3:
        return [(run, parts[2]) for run in api.sweep(path).runs]
    return [(run, getattr(run, "sweep_name", None)) for run in api.runs(path, filters={"tags": {"$in": [ablation]}})]


def fetch_wandb(paths: list[str], ablation: str, profile: str, records_dir: Path,
                api: Any = None, replace: bool = False) -> tuple[dict[str, str], Counter]:
    """Store the runs of W&B sweeps or projects into records_dir; {name: action} as `store` says, and why others
    were skipped."""
    for path in paths:
        if path.count("/") not in (1, 2) or not all(path.split("/")):
            raise ValueError(f"--wandb wants ENTITY/PROJECT/SWEEP_ID or ENTITY/PROJECT, got {path!r}")
    if api is None:
        import wandb

        api = wandb.Api()
    done, skipped = {}, Counter()
    for path in paths:
        for run, sweep_id in wandb_runs(path, ablation, api):
            record = from_wandb_run(run, ablation, profile, sweep_id)
            if record["ablation"] != ablation or record["profile"] != profile:
                skipped["another ablation or profile"] += 1
            elif action := store(records_dir, record, replace=replace):
                done[record["name"]] = action
            else:
                kept = stored_record(records_dir, record)[1] or {}
                skipped["the run's own record is kept" if kept.get("source") != "wandb" else "already stored"] += 1
    return done, skipped
