"""Local backend: run a sweep's trials as `vit-ablate fit` processes, resumable and interruptible.

State lives in `runs/<ablation>/<profile>/.sweep-state.json` (atomic JSON, keyed by trial id).
A trial is done when fit exited 0 and wrote a completed record, or its record says diverged;
done trials are skipped, interrupted ones re-run (fit resumes from last.ckpt), failed ones
re-run only with retry_failed. Children start in their own session; a signal to the sweep
is forwarded to every child's process group and waited for, so no DDP rank outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from vit_lightning.bookkeeping import FINAL, now, write_atomic
from vit_lightning.sweep.trials import Trial, executable, find_record

STATE = ".sweep-state.json"
GRACE_S = 60.0  # after forwarding a stop signal, wait this long before killing the groups


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
        self.index = {t.id: k for k, t in enumerate(trials, 1)}
        self.running: dict[int, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stop_signal: int | None = None
        self.stop_time = 0.0
        self.durations: list[float] = []
        self.counts = {"completed": 0, "diverged": 0, "failed": 0, "interrupted": 0}
        self.swept = [k for k in (trials[0].params if trials else {}) if len({str(t.params.get(k)) for t in trials}) > 1]

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
        queue = self.plan()
        self.total, self.start = len(queue), time.monotonic()
        handlers = self._install_signals()
        try:
            workers = [threading.Thread(target=self._worker, args=(queue, env), daemon=True) for env in self.slots]
            for w in workers:
                w.start()
            while any(w.is_alive() for w in workers):
                for w in workers:
                    w.join(0.2)
                self._escalate()
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)
        c, skipped = self.counts, self.skipped
        self.log(f"[sweep] finished in {clock(time.monotonic() - self.start)}: {c['completed']} completed, "
                 f"{c['diverged']} diverged, {c['failed'] + skipped['failed']} failed, {c['interrupted']} interrupted"
                 f", {skipped['done']} done before"
                 + (f", {skipped['busy']} still running elsewhere" if skipped["busy"] else ""))
        if self.stop_signal is not None:
            return 128 + self.stop_signal
        return 1 if c["failed"] + skipped["failed"] + skipped["busy"] else 0

    def _worker(self, queue: list[Trial], env_overlay: dict[str, str]) -> None:
        while True:
            with self.lock:
                if self.stop_signal is not None or not queue:
                    return
                trial = queue.pop(0)
            self._run_one(trial, env_overlay)

    def _label(self, trial: Trial) -> str:
        return " ".join(f"{k}={trial.params[k]}" for k in self.swept) or trial.id

    def _run_one(self, trial: Trial, env_overlay: dict[str, str]) -> None:
        k, n = self.index[trial.id], len(self.trials)
        env = {**os.environ, **env_overlay}
        parallel = len(self.slots) > 1
        log_path = trial.record_dir / ".sweep-logs" / f"{trial.id}.log"
        with self.lock:
            if self.stop_signal is not None:
                return
            out = None
            if parallel:  # interleaved output of concurrent trials is unreadable: one log per trial
                log_path.parent.mkdir(parents=True, exist_ok=True)
                out = open(log_path, "ab")
            proc = subprocess.Popen(executable(trial.command), env=env, start_new_session=True,
                                    stdout=out, stderr=subprocess.STDOUT if out else None)
            self.running[proc.pid] = proc
        attempts = self.state.get(trial).get("attempts", 0) + 1
        self.state.update(trial, status="running", pid=proc.pid, host=socket.gethostname(), attempts=attempts,
                          started_at=now(), rc=None)
        where = f" (log: {log_path})" if parallel else ""
        self.log(f"[sweep] trial {k}/{n} started: {self._label(trial)}{where}")
        t0 = time.monotonic()
        rc = proc.wait()
        with self.lock:
            self.running.pop(proc.pid, None)
        if out:
            out.close()
        self._finish(trial, rc, time.monotonic() - t0)

    def _finish(self, trial: Trial, rc: int, seconds: float) -> None:
        record = find_record(trial)
        rstatus = (record or {}).get("status")
        if rstatus == "diverged" or (rc == 0 and rstatus == "completed"):
            status, error = rstatus, None
        elif self.stop_signal is not None:
            status, error = "interrupted", f"stopped by signal {self.stop_signal}"
        else:
            status = "failed"
            error = (record or {}).get("error") or (
                f"exit code {rc}" if rc else f"fit exited 0 but left no completed record in {trial.record_dir}")
        self.state.update(trial, status=status, rc=rc, error=error, finished_at=now(), pid=None,
                          record=(record or {}).get("_path"))
        with self.lock:
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

    # --- stopping ------------------------------------------------------------------------------------
    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum, frame) -> None:
        with self.lock:
            first = self.stop_signal is None
            if first:
                self.stop_signal, self.stop_time = signum, time.monotonic()
            procs = list(self.running.values())
        if first:
            self.log(f"[sweep] {signal.Signals(signum).name}: stopping {len(procs)} running trial(s); again to kill")
        self._signal_groups(procs, signum if first else signal.SIGKILL)

    def _escalate(self) -> None:
        """Kill the children's groups if they ignore the forwarded signal for GRACE_S."""
        if self.stop_signal is not None and time.monotonic() - self.stop_time > GRACE_S:
            with self.lock:
                procs = list(self.running.values())
            self._signal_groups(procs, signal.SIGKILL)

    @staticmethod
    def _signal_groups(procs: list[subprocess.Popen], sig: int) -> None:
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)  # the child leads its own session: its group is it plus its DDP ranks
            except ProcessLookupError:
                pass


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def slots(parallel: int, gpus: list[str], cpus: int | None = None) -> list[dict[str, str]]:
    """Env overlays for `parallel` concurrent trials: disjoint CUDA_VISIBLE_DEVICES groups, or a share of the CPU threads."""
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    if gpus:
        if parallel > len(gpus):
            raise ValueError(f"--parallel {parallel} needs at least {parallel} GPUs; {len(gpus)} visible ({','.join(gpus)})")
        size = len(gpus) // parallel
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * size:(i + 1) * size])} for i in range(parallel)]
    if parallel == 1:
        return [{}]
    cpus = cpus or len(os.sched_getaffinity(0))
    threads = str(max(1, cpus // parallel))
    return [{"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads} for _ in range(parallel)]
