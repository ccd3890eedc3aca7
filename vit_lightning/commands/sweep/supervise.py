"""Processes of both sweep backends: GPU groups per slot, one thread per slot, signals forwarded then escalated.

Every process starts in its own session, so a signal to the sweep reaches it only through the
supervisor: the first SIGINT/SIGTERM is forwarded to every child's process group (a trial with
its DDP ranks, or a `wandb agent`, which relays it to its run); a second one, or GRACE_S seconds
without the children exiting, SIGKILLs the children and everything below them. A SIGTERM that
repeats within SAME_STOP_S is the same stop, not a second one: `scancel` and pre-emption signal
every process of a job at once, and the job script forwards that signal to the sweep as well.
SIGUSR1 is the job script's word that the job's time limit is near: the children get SIGTERM (they
stop with a checkpoint) and a SIGTERM after it (the time limit itself) is the same stop; so is a SIGUSR1 after any
stop (a cancel or pre-emption in the job's last minutes), and, inside a SLURM job, a later SIGTERM. A stopped
sweep exits with 128 + the signal number. When the runner itself fails (`fail`: it cannot write its
state, cannot start a process), the children are stopped the same way and reaped.

The signal handler only notes the signal (no lock, no output): signals arrive microseconds apart
and a handler runs inside another handler or inside any locked region of the main thread, so
whatever it waited on could be its own. The main thread acts on the noted signals between its waits.

Every child learns the sweep's pid (SWEEP_PID_ENV): a trial whose sweep dies (SIGKILL, out of
memory) stops itself as if the sweep had stopped it (commands/fit). A trial whose worker died
(forkserver.WorkerDied) is stopped here: SIGTERM to its group, SIGKILL after GRACE_S.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from vit_lightning.commands.sweep.forkserver import WorkerDied
from vit_lightning.core.names import GRACE_ENV, SWEEP_PID_ENV, WORKERS_ENV

GRACE_S = float(os.environ.get(GRACE_ENV, 60.0))  # after forwarding a stop signal, wait this long before killing
SAME_STOP_S = 5.0  # a SIGTERM this soon after the first is the same job-wide stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # SIGUSR1: the job script's "time limit near"
POLL_S = 0.05  # how soon the main thread acts on a noted signal


def stop_name(signum: int) -> str:
    """How a stop is named in the log and the state: the signal, or the time limit it stands for."""
    if signum == signal.SIGUSR1:
        return "the job's time limit (SIGUSR1)"
    return signal.Signals(signum).name


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def split_gpus(gpus: list[str], groups: int | None = None, per_group: int | None = None) -> list[list[str]]:
    """Disjoint groups of the GPUs, one per slot: `groups` of `per_group` (default: one GPU each, or an even split)."""
    if groups is not None and groups < 1:
        raise ValueError(f"need at least 1 slot, got {groups}")
    if not gpus:
        return [[] for _ in range(groups or 1)]
    if per_group is not None and not 1 <= per_group <= len(gpus):
        raise ValueError(f"GPUs per slot must be between 1 and {len(gpus)} (visible GPUs: {','.join(gpus)})")
    per_group = per_group or max(1, len(gpus) // (groups or len(gpus)))
    groups = groups or len(gpus) // per_group
    if groups * per_group > len(gpus):
        raise ValueError(f"{groups} slots x {per_group} GPU(s) needs {groups * per_group} GPUs; "
                         f"{len(gpus)} visible ({','.join(gpus)})")
    return [gpus[i * per_group:(i + 1) * per_group] for i in range(groups)]


def slot_envs(groups: list[list[str]], cpus: int | None = None, per_group: int = 1) -> list[dict[str, str]]:
    """One env overlay per slot: its CUDA_VISIBLE_DEVICES group, or without GPUs an equal share of the CPU threads.

    `per_group` trials share each group: slot k runs on group k mod len(groups) (so a sweep's last few trials
    spread over the GPUs), and each slot gets its share of the CPUs for loader workers (WORKERS_ENV).
    """
    if per_group < 1:
        raise ValueError(f"need at least 1 trial per GPU, got {per_group}")
    slots = [groups[k % len(groups)] for k in range(len(groups) * per_group)]
    cpus = cpus or len(os.sched_getaffinity(0))
    if any(groups):
        envs = [{"CUDA_VISIBLE_DEVICES": ",".join(g)} for g in slots]
    elif len(slots) == 1:
        return [{}]
    else:
        threads = str(max(1, cpus // len(slots)))
        envs = [{"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads} for _ in slots]
    if per_group > 1:  # one trial per GPU keeps its data.num_workers: the machine is sized for the profile
        share = str(loader_share(cpus, sum(max(1, len(g)) for g in slots)))
        envs = [{**env, WORKERS_ENV: share} for env in envs]
    return envs


def loader_share(cpus: int, processes: int) -> int:
    """Loader workers per training process: one CPU for each process itself, the rest split evenly (at least 1)."""
    return max(1, (cpus - processes) // processes)


def descendants(pid: int) -> list[int]:
    """Every live process below pid, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


class Supervisor:
    """Starts child processes for slot threads and stops them all on SIGINT/SIGTERM."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.lock = threading.Lock()
        self.running: dict[int, subprocess.Popen] = {}
        self.stop_signal: int | None = None
        self.failure: str | None = None  # why the runner itself failed (then it stops like on SIGTERM)
        self._stop_time = 0.0
        self._stopped = threading.Event()
        self._noted: deque[tuple[int, float]] = deque()  # (signal, when) noted by the handler, not yet acted on
        self._acted: int | None = None  # the signal of the stop the main thread acted on

    def run(self, slots: int, work: Callable[[int], None]) -> None:
        """Call work(slot) on one thread per slot until all return; signals stop the children meanwhile."""
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(slots)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(POLL_S)
                self._act()
                self._escalate()
            self._reap_abandoned()
        finally:
            self._act()
            for s, old in handlers.items():
                signal.signal(s, old)

    def _reap_abandoned(self) -> None:
        """Children no slot waits for any more (their runner failed): stopped (SIGKILL after GRACE_S) and reaped."""
        if self.running:
            self.fail(self.failure or "a process outlived its slot")
        while self.running:
            time.sleep(0.1)
            self._act()
            self._escalate()
            with self.lock:
                self.running = {pid: p for pid, p in self.running.items() if p.poll() is None}

    @property
    def stopping(self) -> bool:
        """A signal arrived or the runner failed: start nothing more."""
        return self.stop_signal is not None or self.failure is not None

    def fail(self, message: str) -> None:
        """The runner itself failed: remember why, start nothing more, stop the children (SIGTERM, then SIGKILL)."""
        with self.lock:
            first = not self.stopping
            if self.failure is None:
                self.failure = message
            if first:
                self._stop_time = time.monotonic()
                self._stopped.set()
            procs = list(self.running.values())
        if first:
            self._signal(procs, signal.SIGTERM)

    def exit_code(self, otherwise: int) -> int:
        """128 + the signal when stopped by one, else `otherwise`."""
        return otherwise if self.stop_signal is None else 128 + self.stop_signal

    def start(self, argv: list[str], env: dict[str, str], stdout=None, pass_fds=(), worker=None):
        """Start argv in its own session (inheriting pass_fds), or fork it from a trial worker
        (forkserver.py); the process handle, None once the sweep is stopping."""
        env = {**env, SWEEP_PID_ENV: str(os.getpid()), GRACE_ENV: str(GRACE_S)}
        with self.lock:
            if self.stopping:
                return None
            if worker is not None:
                proc = worker.start(argv, env, stdout=stdout, pass_fds=pass_fds)
            else:
                proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=stdout, pass_fds=pass_fds,
                                        stderr=subprocess.STDOUT if stdout else None)
            self.running[proc.pid] = proc
        return proc

    def wait(self, proc: subprocess.Popen) -> int:
        """The child's exit code, once it has exited; WorkerDied (the trial stopped, then reaped) if its worker died."""
        try:
            return proc.wait()
        except WorkerDied:
            self._stop_orphan(proc)
            raise
        finally:
            with self.lock:
                self.running.pop(proc.pid, None)

    def _stop_orphan(self, proc) -> None:
        """Stop a trial whose worker died (it is no child of ours): SIGTERM, SIGKILL after GRACE_S; wait until gone."""
        self._signal([proc], signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while not proc.gone(timeout=0.2):
            if time.monotonic() > deadline:
                self._kill([proc])
                deadline = float("inf")
        proc.close()

    def sleep(self, seconds: float) -> bool:
        """Wait, unless the sweep is stopping; True if it is not."""
        return not self._stopped.wait(seconds)

    def _on_signal(self, signum, frame) -> None:
        """Note the signal; the main thread acts on it (`_act`). Plain assignments and a deque append only: no
        lock, no output, so a handler that interrupts another handler or a locked region cannot wait on itself."""
        if self.stop_signal is None:  # the slots start nothing more from now on
            self.stop_signal = signum
        self._noted.append((signum, time.monotonic()))

    def _act(self) -> None:
        """Act on every noted signal, in order: the first stops the children, a repeat of it is the same stop,
        another one kills them."""
        while self._noted:
            signum, when = self._noted.popleft()
            with self.lock:
                first = self._acted is None
                if first:
                    self._acted, self.stop_signal, self._stop_time = signum, signum, when
                    self._stopped.set()
                same = not first and self._same_stop(signum, when)
                procs = list(self.running.values())
            if first:
                how = "" if signum == signal.SIGUSR1 else "; again to kill"
                self.log(f"[sweep] {stop_name(signum)}: stopping {len(procs)} process(es){how}")
                self._signal(procs, signal.SIGTERM if signum == signal.SIGUSR1 else signum)
            elif not same:
                self.log(f"[sweep] {signal.Signals(signum).name} again: killing {len(procs)} process(es)")
                self._kill(procs)

    def _same_stop(self, signum: int, when: float) -> bool:
        """A signal that belongs to the stop already under way: any time-limit notice (SIGUSR1: a stop is one already),
        and a SIGTERM after the time limit's stop, after the job-wide copy of it, or anywhere in a SLURM job (no one
        types it there twice to kill: the job's own time limit and pre-emption send it, and SLURM kills after them)."""
        if signum == signal.SIGUSR1:
            return True
        if signum != signal.SIGTERM:
            return False
        if self._acted == signal.SIGUSR1 or (self._acted == signal.SIGTERM and os.environ.get("SLURM_JOB_ID")):
            return True
        return self._acted == signal.SIGTERM and when - self._stop_time < SAME_STOP_S

    def _escalate(self) -> None:
        """Kill the children if they ignore the forwarded signal for GRACE_S."""
        if self._stopped.is_set() and time.monotonic() - self._stop_time > GRACE_S:  # set with _stop_time
            with self.lock:
                procs = list(self.running.values())
            self._kill(procs)

    @staticmethod
    def _signal(procs: list[subprocess.Popen], sig: int) -> None:
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)  # the child leads its own session: its group is it plus its DDP ranks
            except ProcessLookupError:
                pass

    @staticmethod
    def _kill(procs: list[subprocess.Popen]) -> None:
        """SIGKILL each child's group and the groups below it (a `wandb agent` runs its trial in a group of its own)."""
        own = os.getpgrp()
        for proc in procs:
            groups = {proc.pid}
            for pid in descendants(proc.pid):  # listed before anything dies: orphans lose their parent link
                try:
                    groups.add(os.getpgid(pid))
                except ProcessLookupError:
                    pass
            for group in groups - {own}:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
