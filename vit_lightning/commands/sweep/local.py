"""Local backend: run a sweep's trials as `vit-ablate fit` processes, resumable, interruptible, shareable.

State lives in `runs/<ablation>/<profile>/.sweep-state.json` (JSON keyed by trial id); a trial's
record is `runs/<ablation>/<profile>/<trial id>/results.json` (fit is handed the id). A trial is
done when fit exited 0 and wrote a completed or stopped_early record (its sweep's hyperband rule, handed
to it on its command line, stopped it), or its record says diverged; a bayes sweep's trials come one at a
time from its search (search.py), once the grid and random trials are taken; done trials
are skipped, interrupted ones (a signal, the sweep stopped) re-run and fit resumes them from
last.ckpt, failed ones re-run only with retry_failed.

Several sweeps may share a run root (two people, a re-queued job and a leftover one): right
before a trial starts, the sweep takes its run directory's lock (rundir.py), re-reads its
record and state, and skips it when it is done or another process holds it; the trial's process
inherits the lock. State updates are read-modify-writes under a lock file, so no sweep loses
another's entries. Processes and signals are the supervisor's (supervise.py), as for the W&B
backend, so no DDP rank outlives the sweep; when the runner itself fails (a state write, a
launch), the sweep stops its trials and exits 1 with one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vit_lightning.commands.sweep import forkserver
from vit_lightning.commands.sweep.supervise import Supervisor, stop_name
from vit_lightning.commands.sweep.trials import Trial, executable, find_record, swept_keys
from vit_lightning.commands.sweep.wandb_backend import SLURM_TASK_VARS
from vit_lightning.core.checks import describe, one_line
from vit_lightning.core.files import now, write_atomic
from vit_lightning.core.names import FINAL
from vit_lightning.run import rundir

STATE = ".sweep-state.json"
STATE_LOCK = ".sweep-state.lock"
# a trial stopped by one of these (its own exit code 128+N, or killed by it) was interrupted, not failed
STOPPED = {128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM, -signal.SIGINT}


def clock(seconds: float) -> str:
    """1h02m03s / 2m03s / 3s."""
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def images_per_s(record: dict | None) -> float | None:
    """A trial's training rate from its record: its last epoch's, else its whole run's; None before an epoch."""
    compute = (record or {}).get("compute") or {}
    return compute.get("epoch_images_per_s") or compute.get("train_images_per_s")


class State:
    """Trial id -> {status, attempts, command, rc, record, ...} in one JSON file per run folder.

    Reads are fresh; an update re-reads the file and replaces it atomically under an flock, so
    concurrent sweeps keep each other's entries. A trial's entry is written only by the holder of
    the trial's run-dir lock.
    """

    def __init__(self, log: Callable[[str], None] | None = None):
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._warned: set[Path] = set()

    def get(self, trial: Trial) -> dict:
        return dict(self._read(trial.record_dir / STATE)["trials"].get(trial.id, {}))

    def update(self, trial: Trial, **fields) -> None:
        path = trial.record_dir / STATE
        with _flocked(trial.record_dir / STATE_LOCK):
            data = self._read(path)
            data["trials"].setdefault(trial.id, {"command": list(trial.command)}).update(fields)
            write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())

    def _read(self, path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and isinstance(data.get("trials"), dict):
                return data
            problem = "not a sweep state"
        except FileNotFoundError:
            return {"trials": {}}
        except (OSError, ValueError) as error:
            problem = one_line(error)
        if path not in self._warned:  # records say what is done; only failed marks are lost
            self._warned.add(path)
            self.log(f"[sweep] {path} is unreadable ({problem}); starting a new one (failed trials will run again)")
        return {"trials": {}}


@contextlib.contextmanager
def _flocked(path: Path):
    """Hold an exclusive flock on path (created if missing) for the with-block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def status_of(trial: Trial, state: State, retry_failed: bool = False) -> str:
    """done (a completed/diverged record), failed (unless retried), or pending."""
    record = find_record(trial)
    if record and record.get("status") in FINAL:
        return "done"
    if state.get(trial).get("status") == "failed" and not retry_failed:
        return "failed"
    return "pending"


EVALUATED = ("completed", "stopped_early")  # record statuses whose run its profile's evaluations read


def pending_evaluations(trial: Trial, state: State) -> list[tuple[str, ...]]:
    """The trial's declared evaluations (Trial.evaluations) its state does not list as done."""
    done = set(state.get(trial).get("evaluated") or ())
    return [command for command in trial.evaluations if shlex.join(command) not in done]


def to_evaluate(trial: Trial, state: State) -> list[tuple[str, ...]]:
    """The trial's declared evaluations still to run, once its run has finished well; [] otherwise."""
    if not trial.evaluations or (find_record(trial) or {}).get("status") not in EVALUATED:
        return []
    return pending_evaluations(trial, state)


def stale_running(trials: list[Trial], state: State) -> list[tuple[Trial, dict]]:
    """Trials the state says are running whose process is gone (killed with the sweep): their lock is free."""
    out = []
    for trial in trials:
        entry = state.get(trial)
        if entry.get("status") != "running":
            continue
        try:
            fd = rundir.acquire(trial.run_dir)
        except (rundir.Busy, OSError):
            continue  # alive, here or on another node
        rundir.release(fd)
        out.append((trial, entry))
    return out


class Runner:
    """Runs trials on `slots` (one env overlay per concurrent process), printing progress."""

    def __init__(self, trials: list[Trial], slots: list[dict[str, str]], retry_failed: bool = False,
                 log: Callable[[str], None] | None = None, fork: bool = True, searches=()):
        self.trials, self.slots, self.retry_failed, self.fork = trials, slots, retry_failed, fork
        self.searches = list(searches)  # bayes searches (search.Search): their trials come one at a time
        self.turn = -1  # the search the last proposal came from
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.state = State(self.log)
        self.supervisor = Supervisor(self.log)
        self.index = {t.id: k for k, t in enumerate(trials, 1)}
        self.queue: list[Trial] = []
        self.running: dict[str, Trial] = {}  # trial id -> trial, while its process runs
        self.durations: list[float] = []
        self.counts = {"completed": 0, "diverged": 0, "failed": 0, "interrupted": 0, "busy": 0, "done": 0,
                       "stopped_early": 0}
        self.evaluations = {"run": 0, "failed": 0}  # the trials' declared evaluations (Trial.evaluations)
        self.swept = swept_keys(trials)

    # --- planning ------------------------------------------------------------------------------------
    def plan(self) -> list[Trial]:
        """The trials to run now (each is checked again right before it starts); says what is skipped."""
        for trial, entry in stale_running(self.trials, self.state):
            where = f"pid {entry.get('pid')} on {entry.get('host')}"
            self.log(f"[sweep] trial {self.index[trial.id]}/{len(self.trials)} was left running by {where}, which "
                     "is gone: interrupted (it runs again, resuming from its checkpoint)")
            self.state.update(trial, status="interrupted", pid=None, error=f"its sweep ({where}) was killed")
        status = {t.id: status_of(t, self.state, self.retry_failed) for t in self.trials}
        todo = [t for t in self.trials if status[t.id] == "pending" or (status[t.id] == "done" and self._to_evaluate(t))]
        self.skipped = {s: sum(v == s for v in status.values()) for s in ("done", "failed")}
        failed = self.skipped["failed"]
        note = f"; {failed} failed skipped (--retry-failed re-runs them)" if failed else ""
        evaluate = sum(status[t.id] == "done" for t in todo)
        note += f"; {evaluate} done with evaluations left to run" if evaluate else ""
        if self.trials or not self.searches:
            self.log(f"[sweep] {len(self.trials)} trials: {self.skipped['done']} done, {len(todo) - evaluate} to "
                     f"run{note}")
        for search in self.searches:
            self.log(f"[sweep] {search.describe()}")
        return todo

    # --- running -------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run every pending trial; 0 when all are done, 1 if any is not, 128+signal when stopped."""
        self.queue = self.plan()
        left = sum(max(0, s.cap - s.done()) for s in self.searches)
        self.total, self.start = len(self.queue) + left, time.monotonic()
        self.supervisor.run(len(self.slots), self._worker)
        if self.supervisor.failure and self.supervisor.stop_signal is None:
            print(f"vit-ablate sweep: error: {self.supervisor.failure}; the sweep stopped, its trials with it",
                  file=sys.stderr, flush=True)
            return 1
        c, skipped = self.counts, self.skipped
        self.log(f"[sweep] finished in {clock(time.monotonic() - self.start)}: {c['completed']} completed, "
                 f"{c['diverged']} diverged, {c['stopped_early']} stopped early, {c['failed'] + skipped['failed']} failed, "
                 f"{c['interrupted']} interrupted"
                 f", {skipped['done'] + c['done']} done before or elsewhere"
                 + (f", {c['busy']} left to another process" if c["busy"] else "")
                 + (f"; {self.evaluations['run']} evaluations run, {self.evaluations['failed']} failed"
                    if any(self.evaluations.values()) else ""))
        undone = sum(status_of(t, self.state, retry_failed=True) != "done" for t in self.trials)
        # trials another live process holds are its to finish: a job array's task that leaves them exits 0,
        # so SLURM counts it a success (--dependency=afterok)
        ok = undone <= c["busy"] and not c["failed"] + c["interrupted"] + self.evaluations["failed"]
        return self.supervisor.exit_code(0 if ok else 1)

    def _worker(self, slot: int) -> None:
        # without an allocation's task layout, as the W&B backend: Lightning starts each trial's DDP processes
        env = {**{k: v for k, v in os.environ.items() if k not in SLURM_TASK_VARS}, **self.slots[slot]}
        worker = None
        try:
            while True:
                with self.supervisor.lock:
                    if self.supervisor.stopping:
                        return
                    trial = self.queue.pop(0) if self.queue else None
                if trial is None and (trial := self._proposed()) is None:
                    return
                if worker is not None and worker.died():  # it died with its last trial: this slot gets a new one
                    worker.close()
                    worker = None
                if worker is None and self.fork and trial.command[0] == "vit-ablate":
                    worker = forkserver.Worker(env)  # imports the stack once for all of this slot's trials
                try:
                    self._run_one(trial, env, worker if trial.command[0] == "vit-ablate" else None)
                except Exception as error:  # the runner itself failed: stop everything, say why in one line
                    self.supervisor.fail(describe(error) if isinstance(error, OSError) else one_line(error))
                    return
        except OSError as error:  # the worker could not start
            self.supervisor.fail(describe(error))
        finally:
            if worker is not None:
                worker.close()

    def _proposed(self) -> Trial | None:
        """The next trial of a bayes search (an unfinished one first), or None when every search is at its cap."""
        if not self.searches:
            return None
        with self.supervisor.lock:  # each call starts at the next search: parallel slots spread over the searches
            self.turn = k = (self.turn + 1) % len(self.searches)
        try:
            for search in self.searches[k:] + self.searches[:k]:
                if (trial := search.next()) is not None:
                    with self.supervisor.lock:
                        if trial.id not in self.index:
                            self.trials.append(trial)
                            self.index[trial.id] = len(self.trials)
                    return trial
        except Exception as error:  # the journal or the sampler: the runner itself failed
            self.supervisor.fail(describe(error) if isinstance(error, OSError) else one_line(error))
        return None

    def _label(self, trial: Trial) -> str:
        return " ".join(f"{k}={trial.params[k]}" for k in self.swept) or trial.id

    def _run_one(self, trial: Trial, env: dict[str, str], worker=None) -> None:
        """Take the trial's run dir, check it is still to run, run it there, record the outcome."""
        k, n = self.index[trial.id], len(self.trials)
        try:
            lock = rundir.acquire(trial.run_dir)
        except rundir.Busy as busy:
            self.log(f"[sweep] trial {k}/{n} skipped: {busy}")
            self._count("busy")
            return
        try:
            now_status = status_of(trial, self.state, self.retry_failed)
            if now_status != "pending":  # another sweep finished (or failed) it since we planned, or it was done
                if not (now_status == "done" and self._to_evaluate(trial)):
                    self.log(f"[sweep] trial {k}/{n} skipped: {now_status} in the meantime")
                self._count("done" if now_status == "done" else "failed")
            else:
                self._launch(trial, {**env, rundir.ENV_FD: str(lock)}, lock, worker)
        finally:
            rundir.release(lock)
        self._evaluate(trial, env, worker)  # eval shares the run dir's lock: after the trial has let it go

    def _to_evaluate(self, trial: Trial) -> list[tuple[str, ...]]:
        return to_evaluate(trial, self.state)

    def _evaluate(self, trial: Trial, env: dict[str, str], worker=None) -> None:
        """Run the trial's evaluations still to run, one process each (forked from the slot's worker when it has
        one), marking each done in the state."""
        k, n = self.index[trial.id], len(self.trials)
        for command in self._to_evaluate(trial):
            log_path = trial.record_dir / ".sweep-logs" / f"{trial.id}.eval.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as out:
                proc = self.supervisor.start(executable(command), env, stdout=out, worker=worker)
                if proc is None:
                    return
                try:
                    rc = self.supervisor.wait(proc)
                except forkserver.WorkerDied:  # the slot's worker is gone: the next trial gets a new one
                    rc, worker = -1, None
            what = " ".join(command[3:-1])
            if rc != 0:
                with self.supervisor.lock:
                    self.evaluations["failed"] += 1
                self.log(f"[sweep] trial {k}/{n}: evaluation {what} failed (exit code {rc}; log: {log_path})")
                continue
            done = [*(self.state.get(trial).get("evaluated") or ()), shlex.join(command)]
            self.state.update(trial, evaluated=done)
            with self.supervisor.lock:
                self.evaluations["run"] += 1
            self.log(f"[sweep] trial {k}/{n}: evaluated {what}")

    def _launch(self, trial: Trial, env: dict[str, str], lock: int, worker=None) -> None:
        k, n = self.index[trial.id], len(self.trials)
        parallel = len(self.slots) > 1
        log_path = trial.record_dir / ".sweep-logs" / f"{trial.id}.log"
        out = None
        if parallel:  # interleaved output of concurrent trials is unreadable: one log per trial
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")
        try:
            attempts = self.state.get(trial).get("attempts", 0) + 1
            proc = self.supervisor.start(executable(trial.command), env, stdout=out, pass_fds=(lock,), worker=worker)
            if proc is None:
                return
            t0 = time.monotonic()
            with self.supervisor.lock:
                self.running[trial.id] = trial
            self.state.update(trial, status="running", pid=proc.pid, host=socket.gethostname(), attempts=attempts,
                              started_at=now(), rc=None)
            where = f" (log: {log_path})" if parallel else ""
            self.log(f"[sweep] trial {k}/{n} started: {self._label(trial)}{where}")
            try:
                rc, died = self.supervisor.wait(proc), None
            except forkserver.WorkerDied as error:  # the trial was stopped and is gone; its exit code with it
                rc, died = None, str(error)
                self.log(f"[sweep] trial {k}/{n}: {died}")
        finally:
            with self.supervisor.lock:
                self.running.pop(trial.id, None)
            if out:
                out.close()
        self._finish(trial, rc, time.monotonic() - t0, died)

    def _finish(self, trial: Trial, rc: int | None, seconds: float, died: str | None = None) -> None:
        record = find_record(trial)
        rstatus = (record or {}).get("status")
        stop = self.supervisor.stop_signal
        if rstatus == "diverged" or (rc == 0 and rstatus in ("completed", "stopped_early")):
            status, error = rstatus, None
        elif died:  # its worker died: interrupted when the sweep had been stopped, else failed
            status, error = ("interrupted" if stop is not None else "failed"), died
        elif stop is not None or rc in STOPPED or rstatus == "interrupted":
            signum = stop or (abs(rc) % 128 if rc in STOPPED else signal.SIGTERM)
            status, error = "interrupted", f"stopped by {stop_name(signum)}"
        else:
            status = "failed"
            error = (record or {}).get("error") or (
                f"exit code {rc}" if rc else f"fit exited 0 but left no completed record in {trial.run_dir}")
        self.state.update(trial, status=status, rc=rc, error=error, finished_at=now(), pid=None,
                          record=(record or {}).get("_path"))
        self._count(status, seconds)
        with self.supervisor.lock:
            finished = sum(self.counts.values())
            left = self.total - finished
            eta = sum(self.durations) / len(self.durations) * left / len(self.slots) if self.durations else 0.0
        why = f" ({error})" if error else ""
        own = images_per_s(record)
        own = f" at {own:,.0f} img/s" if own else ""
        self.log(f"[sweep] trial {self.index[trial.id]}/{len(self.trials)} {status} in {clock(seconds)}{own}{why} | "
                 f"{finished}/{self.total} run{self._throughput()} | elapsed {clock(time.monotonic() - self.start)} | "
                 f"~{clock(eta)} left")

    def _throughput(self) -> str:
        """' | K running: R img/s' over the trials running now (each its last epoch's rate), or '' when none."""
        with self.supervisor.lock:
            running = list(self.running.values())
        if not running:
            return ""
        total = sum(images_per_s(find_record(t)) or 0.0 for t in running)
        return f" | {len(running)} running: {total:,.0f} img/s"

    def _count(self, outcome: str, seconds: float | None = None) -> None:
        with self.supervisor.lock:
            self.counts[outcome] += 1
            if outcome in ("completed", "diverged", "stopped_early", "failed") and seconds is not None:
                self.durations.append(seconds)
