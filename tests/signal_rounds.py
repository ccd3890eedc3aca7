"""A long-lived local sweep process for tests/test_signal_rounds.py: round after round, the real Runner runs one
trial (a cheap process that stops on SIGTERM) until the test's signals stop it; prints the exit code of each round
and waits for a line on stdin before the next.

argv: run root, then one word per round: `slow` rounds hold the supervisor's lock 50 ms every time it is taken (a
signal that lands in a locked region finds it held), `slowstate` rounds write the sweep state slowly.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from vit_lightning.commands.sweep import local
from vit_lightning.commands.sweep.trials import make

TRIAL = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); time.sleep(120)"


class SlowLock:
    """A lock that, once taken, holds on for 50 ms: the widest window for a signal to arrive while it is held."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self):
        self._lock.acquire()
        time.sleep(0.05)

    def __exit__(self, *exc):
        self._lock.release()


def main(root: str, kinds: list[str]) -> None:
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
              "command": ["${env}", "python", "-c", TRIAL, "${args}"], "parameters": {}}
    params = {"run.root": root, "run.ablation": "sig", "run.profile": "rounds", "model.lr": 0.001}
    update = local.State.update
    for signum in (signal.SIGTERM, signal.SIGUSR1):  # a round's last signal may land after its sweep is over
        signal.signal(signum, lambda *args: None)  # (a handler, unlike SIG_IGN, is not inherited by the trials)
    for k, kind in enumerate(kinds):
        runner = local.Runner([make(config, params, 0)], [{}], fork=False,
                              log=lambda msg: print(msg, flush=True))
        if kind == "slow":
            runner.supervisor.lock = SlowLock()
        if kind == "slowstate":
            def slow_update(self, trial, **fields):
                time.sleep(0.05)
                update(self, trial, **fields)
            local.State.update = slow_update
        print(f"round {k} exit {runner.run()}", flush=True)
        local.State.update = update
        sys.stdin.readline()  # the test reads this round's state before the next round rewrites it


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
