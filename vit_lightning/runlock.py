"""One writer per run directory: an flock on {run dir}/.lock, released by the kernel when its holder dies.

`fit` (rank 0) holds it for its whole life. The local sweep takes it before it re-checks and
starts a trial, and hands it to the trial's process (an inherited file descriptor, named in
ENV_FD), so a trial whose sweep was killed still holds its directory, and no other sweep or
`fit` can train that directory, resume from its checkpoint or delete its files meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK = ".lock"
ENV_FD = "VIT_ABLATE_RUN_LOCK_FD"  # a lock on this run dir that the parent (the sweep) took for this process
BUSY = 75  # fit's exit code when another process trains its run dir (EX_TEMPFAIL: try again later)


class Busy(Exception):
    """Another live process holds the run directory; the message names it."""


def acquire(directory: Path) -> int:
    """Lock directory (created if missing) for this process: the lock's fd; Busy if held; OSError if unwritable."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK
    fd = _inherited(path)
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(f"{directory} is being trained by {holder(directory)}") from None
    try:  # who holds it, for the message others get
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def release(fd: int) -> None:
    """Drop this process's hold (a child that inherited the lock keeps it until it exits)."""
    os.close(fd)


def holder(directory: Path) -> str:
    """'pid N on HOST' of the lock's holder, as it wrote it."""
    try:
        return (Path(directory) / LOCK).read_text().strip() or "another process"
    except OSError:
        return "another process"


def _inherited(path: Path) -> int | None:
    """The fd of this lock file the parent handed down (ENV_FD), if it is open and really that file."""
    try:
        fd = int(os.environ.get(ENV_FD, ""))
        mine, given = os.fstat(fd), os.stat(path)
    except (ValueError, OSError):
        return None
    return fd if (mine.st_dev, mine.st_ino) == (given.st_dev, given.st_ino) else None
