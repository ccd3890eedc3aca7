"""Signals back to back, round after round, to one real local sweep process (tests/signal_rounds.py): two and
three SIGTERMs, SIGTERM and the time limit's SIGUSR1 in either order and in bursts, signals landing in a locked region or during a state
write; every round ends in one orderly stop, never a hang, a kill or a traceback."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vit_lightning.commands.sweep import local, supervise

TERM, USR1 = signal.SIGTERM, signal.SIGUSR1
# (the driver's kind of round, the signals with the seconds to wait before each)
PATTERNS = [
    ("plain", [(0, TERM), (0, TERM)]),
    ("slow", [(0, TERM), (0.01, TERM)]),  # the second lands while the first is being acted on, its lock held
    ("slow", [(0, TERM), (0.01, TERM), (0.01, TERM)]),
    ("plain", [(0, USR1), (0.01, TERM)]),  # the time limit's SIGTERM during its SIGUSR1 stop
    ("slow", [(0, USR1), (0.02, TERM), (0, TERM)]),
    ("slowstate", [(0, TERM), (0.03, TERM), (0.06, TERM)]),  # later ones land during the state's writes
    ("plain", [(0, TERM), (0.01, USR1)]),  # a cancel or pre-emption, then the time limit's notice
    ("slow", [(0, TERM), (0.01, USR1), (0, USR1), (0, TERM)]),
    ("plain", [(0, USR1), (0.01, USR1), (0, USR1)]),  # a burst of time-limit notices
    ("slow", [(0, USR1), (0.02, USR1), (0, TERM), (0, USR1)]),
]
ROUNDS = 60  # each pattern six times
ROUND_TIMEOUT_S = 30.0


def lines_of(proc: subprocess.Popen) -> queue.Queue:
    """The process's output lines, read on a thread, so that a hang is a timeout here rather than a blocked read."""
    out: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            out.put(line.rstrip("\n"))
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def until(out: queue.Queue, prefix: str, log: list[str], what: str) -> str:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while True:
        try:
            line = out.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"hang: no {what} within {ROUND_TIMEOUT_S:.0f} s\n" + "\n".join(log[-30:])) from None
        if line is None:
            raise AssertionError(f"the sweep process ended before {what}\n" + "\n".join(log[-30:]))
        log.append(line)
        if line.startswith(prefix):
            return line


def test_back_to_back_signals_end_every_round_in_one_orderly_stop(tmp_path):
    rounds = [PATTERNS[k % len(PATTERNS)] for k in range(ROUNDS)]
    driver = Path(__file__).with_name("signal_rounds.py")
    proc = subprocess.Popen([sys.executable, str(driver), str(tmp_path), *(kind for kind, _ in rounds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(driver.parent),
                                                                               os.environ.get("PYTHONPATH", "")])})
    out, log = lines_of(proc), []
    try:
        for k, (kind, signals) in enumerate(rounds):
            start = len(log)
            until(out, "[sweep] trial 1/1 started", log, f"start of round {k}")
            for wait, signum in signals:
                time.sleep(wait)
                os.kill(proc.pid, signum)
            code = int(until(out, f"round {k} exit", log, f"end of round {k} ({kind}, {signals})").split()[-1])
            first = signals[0][1]
            said = "\n".join(log[start:])
            assert code == 128 + first, said
            assert said.count("stopping 1 process(es)") == 1 and "killing" not in said, said
            assert "Traceback" not in said, said
            [entry] = json.loads((tmp_path / "sig" / "rounds" / local.STATE).read_text())["trials"].values()
            assert entry["status"] == "interrupted" and entry["pid"] is None and entry["rc"] in (143, -TERM), entry
            name = "the job's time limit (SIGUSR1)" if first == USR1 else "SIGTERM"
            assert entry["error"] == f"stopped by {name}", entry
            proc.stdin.write("next\n")  # the driver starts the next round only now
            proc.stdin.flush()
        assert proc.wait(timeout=ROUND_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("slurm", [False, True])
@pytest.mark.parametrize("order", [(TERM, USR1), (USR1, TERM), (TERM, TERM), (USR1, USR1), (TERM, USR1, TERM, USR1)])
def test_signals_in_any_order_are_one_stop_and_a_late_sigterm_kills_only_outside_a_slurm_job(monkeypatch, order,
                                                                                             slurm):
    """The supervisor's rule, signal by signal, 10 s apart (past the job-wide copy's 5 s): the first signal stops the
    children with SIGTERM, a time-limit notice after it is the same stop, and a second SIGTERM kills them only where
    a person sends it (a SLURM job's own signals are never a request to kill)."""
    if slurm:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    said, sent = [], []
    boss = supervise.Supervisor(said.append)
    monkeypatch.setattr(boss, "_signal", lambda procs, sig: sent.append(sig))
    monkeypatch.setattr(boss, "_kill", lambda procs: sent.append("kill"))
    for k, signum in enumerate(order):
        boss._noted.append((signum, 100.0 + 10 * k))
    boss._act()
    repeat_term = order[0] == TERM and TERM in order[1:]
    assert sent[0] == TERM and boss.exit_code(0) == 128 + order[0]
    assert sent[1:] == (["kill"] if repeat_term and not slurm else []), said
