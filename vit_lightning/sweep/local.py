"""Local backend: run a sweep's trials as `vit-ablate fit` processes, resumable and interruptible.

State lives in `runs/<ablation>/<profile>/.sweep-state.json` (atomic JSON, keyed by trial id).
A trial's record is `runs/<ablation>/<profile>/<trial id>/results.json` (fit is handed the id).
A trial is done when fit exited 0 and wrote a completed record, or its record says diverged;
done trials are skipped, interrupted ones re-run (fit resumes from last.ckpt), failed ones
re-run only with retry_failed. Processes and signals are the supervisor's (supervise.py), as
for the W&B backend, so no DDP rank outlives the sweep.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vit_lightning.bookkeeping import FINAL, now, write_atomic
from vit_lightning.sweep.supervise import Supervisor
from vit_lightning.sweep.trials import Trial, executable, find_record, swept_keys

STATE = ".sweep-state.json"


def clock(seconds: float) -> str:
    """1h02m03s / 2m03s / 3s."""
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class State:
    """Trial id -> {status, attempts, argv, rc, record, ...} in one JSON file per run directory."""

    def __init__(self):
        self._lock = threading.Lock()
        self._files: dict[Path, dict] = {}

    def _data(self, trial: Trial) -> tuple[Path, dict]:
        path = trial.record_dir / STATE
        if path not in self._files:
            try:
                self._files[path] = json.loads(path.read_text())
            except (OSError, ValueError):
                self._files[path] = {"trials": {}}
        return path, self._files[path]

    def get(self, trial: Trial) -> dict:
        with self._lock:
            return dict(self._data(trial)[1]["trials"].get(trial.id, {}))

    def update(self, trial: Trial, **fields) -> None:
        with self._lock:
            path, data = self._data(trial)
            data["trials"].setdefault(trial.id, {"command": list(trial.command)}).update(fields)
            write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def status_of(trial: Trial, state: State) -> str:
    """done (a completed/diverged record), failed, busy (its process still runs), or pending."""
    saved = state.get(trial)
    if saved.get("status") == "failed":
        return "failed"
    record = find_record(trial)
    if record and record.get("status") in FINAL:
        return "done"
    if saved.get("status") == "running" and saved.get("host") == socket.gethostname() and _alive(saved.get("pid")):
        return "busy"  # a child of a sweep that was killed hard still runs: never train one run dir twice
    return "pending"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True


class Runner:
    """Runs trials on `slots` (one env overlay per concurrent process), printing progress."""

    def __init__(self, trials: list[Trial], slots: list[dict[str, str]], retry_failed: bool = False,
                 log: Callable[[str], None] | None = None):
        self.trials, self.slots, self.retry_failed = trials, slots, retry_failed
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.state = State()
        self.supervisor = Supervisor(self.log)
        self.index = {t.id: k for k, t in enumerate(trials, 1)}
        self.queue: list[Trial] = []
        self.durations: list[float] = []
        self.counts = {"completed": 0, "diverged": 0, "failed": 0, "interrupted": 0}
        self.swept = swept_keys(trials)

    # --- planning ------------------------------------------------------------------------------------
    def plan(self) -> list[Trial]:
        """The trials to run now; says what is skipped and why."""
        status = {t.id: status_of(t, self.state) for t in self.trials}
        if self.retry_failed:
            status = {k: "pending" if s == "failed" else s for k, s in status.items()}
        todo = [t for t in self.trials if status[t.id] == "pending"]
        self.skipped = {s: sum(v == s for v in status.values()) for s in ("done", "failed", "busy")}
        for t in self.trials:
            if status[t.id] == "busy":
                pid = self.state.get(t).get("pid")
                self.log(f"[sweep] trial {self.index[t.id]} still runs as pid {pid} (an earlier sweep's child): "
                         "not started again")
        failed = self.skipped["failed"]
        note = f"; {failed} failed skipped (--retry-failed re-runs them)" if failed else ""
        self.log(f"[sweep] {len(self.trials)} trials: {self.skipped['done']} done, {len(todo)} to run{note}")
        return todo

    # --- running -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run every pending trial; 0 when all are done, 1 if any failed or still runs elsewhere, 128+signal when stopped."""
        self.queue = self.plan()
        self.total, self.start = len(self.queue), time.monotonic()
        self.supervisor.run(len(self.slots), self._worker)
        c, skipped = self.counts, self.skipped
        self.log(f"[sweep] finished in {clock(time.monotonic() - self.start)}: {c['completed']} completed, "
                 f"{c['diverged']} diverged, {c['failed'] + skipped['failed']} failed, {c['interrupted']} interrupted"
                 f", {skipped['done']} done before"
                 + (f", {skipped['busy']} still running elsewhere" if skipped["busy"] else ""))
        return self.supervisor.exit_code(1 if c["failed"] + skipped["failed"] + skipped["busy"] else 0)

    def _worker(self, slot: int) -> None:
        env = {**os.environ, **self.slots[slot]}
        while True:
            with self.supervisor.lock:
                if self.supervisor.stop_signal is not None or not self.queue:
                    return
                trial = self.queue.pop(0)
            self._run_one(trial, env)

    def _label(self, trial: Trial) -> str:
        return " ".join(f"{k}={trial.params[k]}" for k in self.swept) or trial.id

    def _run_one(self, trial: Trial, env: dict[str, str]) -> None:
        k, n = self.index[trial.id], len(self.trials)
        parallel = len(self.slots) > 1
        log_path = trial.record_dir / ".sweep-logs" / f"{trial.id}.log"
        out = None
        if parallel:  # interleaved output of concurrent trials is unreadable: one log per trial
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")
        try:
            proc = self.supervisor.start(executable(trial.command), env, stdout=out)
            if proc is None:
                return
            attempts = self.state.get(trial).get("attempts", 0) + 1
            self.state.update(trial, status="running", pid=proc.pid, host=socket.gethostname(), attempts=attempts,
                              started_at=now(), rc=None)
            where = f" (log: {log_path})" if parallel else ""
            self.log(f"[sweep] trial {k}/{n} started: {self._label(trial)}{where}")
            t0 = time.monotonic()
            rc = self.supervisor.wait(proc)
        finally:
            if out:
                out.close()
        self._finish(trial, rc, time.monotonic() - t0)

    def _finish(self, trial: Trial, rc: int, seconds: float) -> None:
        record = find_record(trial)
        rstatus = (record or {}).get("status")
        stop = self.supervisor.stop_signal
        if rstatus == "diverged" or (rc == 0 and rstatus == "completed"):
            status, error = rstatus, None
        elif stop is not None:
            status, error = "interrupted", f"stopped by signal {stop}"
        else:
            status = "failed"
            error = (record or {}).get("error") or (
                f"exit code {rc}" if rc else f"fit exited 0 but left no completed record in {trial.run_dir}")
        self.state.update(trial, status=status, rc=rc, error=error, finished_at=now(), pid=None,
                          record=(record or {}).get("_path"))
        with self.supervisor.lock:
            self.counts[status] += 1
            if status != "interrupted":
                self.durations.append(seconds)
            finished = sum(self.counts.values())
            left = self.total - finished
            eta = sum(self.durations) / len(self.durations) * left / len(self.slots) if self.durations else 0.0
        why = f" ({error})" if error else ""
        self.log(f"[sweep] trial {self.index[trial.id]}/{len(self.trials)} {status} in {clock(seconds)}{why} | "
                 f"{finished}/{self.total} run | elapsed {clock(time.monotonic() - self.start)} | "
                 f"~{clock(eta)} left")
