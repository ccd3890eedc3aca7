"""Damaged sweep files, found before anything trains: a sweep state or a bayes journal that cannot be read.

The records are the source of truth; the state (`.sweep-state.json`) and a bayes search's journal
(`.bayes-<key>.json`) only remember what the records do not say (a failed trial's mark, the order of the
proposals). A damaged state is rebuilt from the records by the next run, which says so (a failed trial's mark
is lost: it runs again). A damaged journal is named in one line with what to do: `--repair` rebuilds it from
the records of its search (a proposal never started is lost: it is proposed again), or move it aside to start
the search over. The damaged file is kept beside as `<name>.damaged`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist

from vit_lightning.commands.sweep import local
from vit_lightning.commands.sweep.trials import Trial
from vit_lightning.commands.sweep.validate import SweepError
from vit_lightning.core.checks import one_line
from vit_lightning.core.files import write_atomic
from vit_lightning.core.names import FINAL, RECORD
from vit_lightning.run import rundir


def _problem(path: Path, shape: Callable[[object], str | None]) -> str | None:
    """What is wrong with a JSON file (unreadable, empty, truncated, the wrong shape), or None (also: missing)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        return f"unreadable ({one_line(error)})"
    if not text.strip():
        return "empty"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return f"not JSON, truncated or overwritten: {error.msg.lower()} (character {error.pos})"
    return shape(data)


def _state_shape(data) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("trials"), dict):
        return f"a {type(data).__name__}, not a sweep state ({{\"trials\": {{...}}}})"
    if bad := sorted(k for k, v in data["trials"].items() if not isinstance(v, dict)):
        return f"the entry of trial {bad[0]} is not a mapping"
    return None


def journal_shape(data) -> str | None:
    """Why a parsed journal is no journal ({"proposals": [{"id": str, "raw": {...}}, ...]}), or None."""
    proposals = data.get("proposals") if isinstance(data, dict) else None
    if not isinstance(proposals, list):
        return f"a {type(data).__name__} without a list of proposals, not a bayes journal"
    for k, p in enumerate(proposals):
        if not (isinstance(p, dict) and isinstance(p.get("id"), str) and isinstance(p.get("raw"), dict)):
            return f"proposal {k + 1} is not {{id, raw}}"
    return None


def journal_values(search, data) -> str | None:
    """Why a well-shaped journal's proposals are not points of `search` (a parameter missing or unknown, a value of
    the wrong type, not finite or outside its range, an id that is not its point's trial, an id twice), or None."""
    seen: set[str] = set()
    for k, proposal in enumerate(data["proposals"], 1):
        raw = proposal["raw"]
        if unknown := sorted(set(raw) - set(search.space)):
            return f"proposal {k} sets {unknown[0]!r}, which the search does not search"
        for name, dist in search.space.items():
            if problem := _value_problem(dist, raw.get(name, _MISSING)):
                return f"proposal {k}'s {name} {problem}"
        if proposal["id"] != (made := search.trial(raw).id):
            return f"proposal {k}'s id {proposal['id']!r} is not its point's trial ({made})"
        if proposal["id"] in seen:
            return f"proposal {k} repeats trial {proposal['id']}"
        seen.add(proposal["id"])
    return None


_MISSING = object()


def _value_problem(dist, value) -> str | None:
    """Why `value` is not a point of one Optuna distribution (categorical: an index into its values), or None."""
    if value is _MISSING:
        return "is missing"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number"
    if not math.isfinite(value):
        return f"is {value!r}, not a finite number"
    if hasattr(dist, "choices"):
        if not isinstance(value, int) or not 0 <= value < len(dist.choices):
            return f"is {value!r}, not the index of one of its {len(dist.choices)} values"
        return None
    if type(dist).__name__ == "IntDistribution" and not isinstance(value, int):
        return f"is {value!r}, not a whole number"
    if not dist.low <= value <= dist.high:
        return f"is {value!r}, outside its range [{dist.low:g}, {dist.high:g}]"
    return None


def _records(folder: Path) -> list[dict]:
    """Every readable record in a sweep folder, oldest first."""
    out = []
    for path in sorted(folder.glob(f"*/{RECORD}")):
        record, _ = rundir.load_record(path.parent)
        if isinstance(record, dict) and isinstance(record.get("trial"), str):
            out.append({**record, "_path": str(path)})
    return sorted(out, key=lambda r: str(r.get("started_at") or ""))


def rebuild_state(folder: Path, trials: list[Trial]) -> int:
    """Write the folder's state anew from its records (interrupted: not finished); the number of entries."""
    commands = {t.id: list(t.command) for t in trials}
    entries = {}
    for record in _records(folder):
        status = record.get("status")
        status = status if status in (*FINAL, "failed") else "interrupted"
        entries[record["trial"]] = {"status": status, "record": record["_path"], "error": record.get("error"),
                                    "pid": None, **({"command": commands[record["trial"]]}
                                                    if record["trial"] in commands else {})}
    with local._flocked(folder / local.STATE_LOCK):
        write_atomic(folder / local.STATE, (json.dumps({"trials": entries}, indent=1, sort_keys=True) + "\n").encode())
    return len(entries)


def raw_of(search, config: dict) -> dict | None:
    """The sampler's point of a record's config in `search` (None: a value outside its space)."""
    raw = {}
    for name in search.space:
        dist, spec = search.params[name]
        v = config.get(name)
        if dist.startswith("categorical"):
            matches = [k for k, x in enumerate(spec["values"]) if x == v]
            if not matches:
                return None
            raw[name] = matches[0]
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        elif dist == "int_uniform":
            raw[name] = int(v)
        elif "min" in spec:
            raw[name] = float(v)
        elif "mu" in spec:
            x = math.log(v) if "log" in dist and v > 0 else v
            raw[name] = NormalDist(spec["mu"], spec["sigma"]).cdf(x)
        else:
            from scipy.stats import beta

            raw[name] = float(beta.cdf(v, spec["a"], spec["b"]))
    return raw


def rebuild_journal(search) -> int:
    """Write a search's journal anew from the records of its trials, oldest first; the number of proposals."""
    proposals = []
    for record in _records(search.folder):
        raw = raw_of(search, record.get("config") or {})
        if raw is not None and search.trial(raw).id == record["trial"]:
            proposals.append({"id": record["trial"], "raw": raw})
    write_atomic(search.journal, (json.dumps({"proposals": proposals}, indent=1) + "\n").encode())
    return len(proposals)


def _set_aside(path: Path) -> Path:
    aside = path.with_name(path.name + ".damaged")
    os.replace(path, aside)
    return aside


def check(trials: list[Trial], searches, repair: bool, dry_run: bool, log: Callable[[str], None]) -> None:
    """Name every damaged state and journal of this sweep in one line each; rebuild them (not in a dry run)
    where the rule above says so; SweepError for a journal that needs --repair."""
    for search in searches:
        if problem := _problem(search.journal, lambda data, s=search: journal_shape(data) or journal_values(s, data)):
            if not repair:
                raise SweepError(f"{search.journal}: damaged bayes journal ({problem}); run again with --repair to "
                                 "rebuild it from the records (the source of truth), or move it aside to start the "
                                 "search over")
            if dry_run:
                log(f"[sweep] {search.journal}: damaged bayes journal ({problem}); --repair without --dry-run "
                    "rebuilds it from the records")
                continue
            aside = _set_aside(search.journal)
            n = rebuild_journal(search)
            log(f"[sweep] {search.journal}: damaged bayes journal ({problem}); rebuilt from the records: {n} "
                f"proposal(s) (the damaged file is {aside.name})")
    folders = sorted({t.record_dir for t in trials} | {s.folder for s in searches})
    for folder in folders:
        if problem := _problem(folder / local.STATE, _state_shape):
            path = folder / local.STATE
            if dry_run:
                log(f"[sweep] {path}: damaged sweep state ({problem}); the next run rebuilds it from the records "
                    "(failed trials will run again), or move it aside")
                continue
            aside = _set_aside(path)
            n = rebuild_state(folder, trials)
            log(f"[sweep] {path}: damaged sweep state ({problem}); rebuilt from the records: {n} trial(s), "
                f"failed trials will run again (the damaged file is {aside.name})")

