"""`vit-ablate fit`: train one run (LightningCLI) and keep its record in {run.root}/{ablation}/{profile}/{name}/."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from argparse import ArgumentError

from lightning.fabric.utilities.exceptions import MisconfigurationException

from vit_lightning.commands.fit.cli import FitCLI, fit_options
from vit_lightning.commands.fit.settings import _quiet, _reruns_this_fit, _warn, linked_option, unknown_options
from vit_lightning.core.names import GRACE_ENV, SWEEP_PID_ENV


def watch_sweep() -> None:
    """A sweep's trial (the leader of its process group) stops itself, as its sweep would, once the sweep is gone."""
    try:
        sweep = int(os.environ[SWEEP_PID_ENV])
    except (KeyError, ValueError):
        return
    if os.getpgrp() != os.getpid():  # a DDP rank Lightning started: the trial (its group's leader) watches
        return
    try:
        pidfd = os.pidfd_open(sweep)
    except OSError:  # gone already
        pidfd = None
    threading.Thread(target=_stop_when_gone, args=(sweep, pidfd), daemon=True).start()


def _stop_when_gone(sweep: int, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the sweep's process has exited
    _warn(f"vit-ablate fit: its sweep (pid {sweep}) is gone; stopping")
    os.killpg(os.getpgrp(), signal.SIGTERM)  # this trial and its DDP ranks: a stop checkpoint, an interrupted record
    time.sleep(float(os.environ.get(GRACE_ENV, 60.0)))
    os.killpg(os.getpgrp(), signal.SIGKILL)  # it ignored SIGTERM: as the sweep would have, after its grace


def main(argv: list[str] | None = None) -> int:
    """`vit-ablate fit [--config FILE] [--model.* --data.* --trainer.* --run.* --seed_everything]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    watch_sweep()
    _quiet()
    try:
        cli = FitCLI(argv)
    except SystemExit as stop:  # --help, --print_config
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except (ArgumentError, ValueError, MisconfigurationException) as error:
        # Bad options stop here, before the run dir exists: nothing is written.
        text = " ".join(str(error).split())
        if isinstance(error, ArgumentError) and "unrecognized arguments:" in text:
            text = unknown_options(text, fit_options()) or text
        text = linked_option(text) or text
        _warn(f"vit-ablate fit: error: {text}")  # rank 0: srun's tasks all fail alike
        return 2
    if cli.starts_other_ranks() and not _reruns_this_fit(argv):
        # Called from Python: the other ranks would re-run the caller's command line. Run this fit as the
        # command itself, whose ranks then get the same argv.
        code = subprocess.call([sys.executable, "-m", "vit_lightning.cli", "fit", *argv])
        return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + signal
    return cli.fit_run()


if __name__ == "__main__":
    sys.exit(main())
