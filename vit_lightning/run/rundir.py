"""One owner of a run directory: its lock, broken files set aside, the previous record read once, the resume point.

`RunDir.open(path, retrain)` is what fit does first, in this order: take the directory's lock (one
writer at a time), set a corrupt results.json or checkpoint aside, read the previous record once,
choose the checkpoint to resume from, and clear a fresh start's stale files. Everything after it
(the record, the loggers' W&B resume decision) works from what it found.

The lock: an flock on {run dir}/.lock, released by the kernel when its holder dies. `fit` (rank 0)
holds it for its whole life. The local sweep takes it before it re-checks and starts a trial, and
hands it to the trial's process (an inherited file descriptor, named in ENV_FD), so a trial whose
sweep was killed still holds its directory, and no other sweep or `fit` can train that directory,
resume from its checkpoint or delete its files meanwhile.

Broken files: a run's resume point must survive a full disk and a kill mid-write (checkpoints are
written atomically), and a file that did get truncated (copied by hand, a disk that failed) must
never stop the run for good: it is moved aside as `<name>.corrupt`, said in one line and in the
record, and the run goes on from what is left (the checkpoint carries the record's history;
without a checkpoint the run starts over).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import socket
import zipfile
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from typing_extensions import override

from vit_lightning.core.checks import one_line
from vit_lightning.core.files import now, write_atomic
from vit_lightning.core.identity import plain
from vit_lightning.core.names import FINAL, LAST_CKPT, RECORD
from vit_lightning.model.position import trained_options

LOCK = ".lock"
RECORD_TURN = ".record.lock"  # writers outside fit change the record one at a time (update_record)
ENV_FD = "VIT_ABLATE_RUN_LOCK_FD"  # a lock on this run dir that the parent (the sweep) took for this process
BUSY = 75  # fit's exit code when another process trains its run dir (EX_TEMPFAIL: try again later)


class Busy(Exception):
    """Another live process holds the run directory; the message names it."""


class RunDirError(ValueError):
    """A record or checkpoint that cannot be read; the message is one line naming the file and the problem."""


def acquire(directory: Path) -> int:
    """Lock directory (created if missing) for this process: the lock's fd; Busy if held; OSError if unwritable."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK
    fd = _inherited(path)
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _flock(fd, fcntl.LOCK_EX, lambda: f"{directory} is {_held_for(path)}")
    try:  # who holds it, for the message others get
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def acquire_shared(directory: Path) -> int:
    """A share of directory's lock, for writers that only add to the record (evaluations): they hold it together, and
    a fit holding it refuses them, as they refuse a fit. The lock's fd; Busy while a fit holds it."""
    path = Path(directory) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _flock(fd, fcntl.LOCK_SH, lambda: f"{directory} is being trained by {holder(directory)}")
    return fd


def _flock(fd: int, how: int, busy) -> None:
    """Take the lock on fd without waiting (`how`: LOCK_EX or LOCK_SH); closes fd and raises Busy(busy()) if held."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(busy()) from None


def _held_for(path: Path) -> str:
    """Why the lock at path is held: shared by evaluations, or 'being trained by' the holder it names."""
    probe = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # takes a share only while no one holds it alone
        return "being evaluated by another process (vit-ablate eval --into-record)"
    except BlockingIOError:
        return f"being trained by {holder(path.parent)}"
    finally:
        os.close(probe)


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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoints, written through a temp file in the same folder and renamed.

    Lightning's own save copies a temp file over the target, which truncates the last good
    checkpoint when the disk fills up; here a failed save leaves the old one and no temp file.
    """

    @override
    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own way
            return super().save_checkpoint(checkpoint, path, storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_atomic(Path(path), buffer.getbuffer())


def use_atomic_checkpoints(strategy) -> None:
    """Give the trainer's strategy our checkpoint writer, unless the user configured one of their own."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:  # the default (the property makes one when none is set)
        strategy.checkpoint_io = AtomicCheckpointIO()


def drop_corrupt_checkpoint(last: Path, owner: bool = True) -> str | None:
    """Move an unreadable checkpoint aside (truncated: no zip directory at its end); what was done, or None."""
    if not last.is_file():
        return None
    try:
        with zipfile.ZipFile(last) as archive:
            if not any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist()):
                raise zipfile.BadZipFile("no data.pkl inside: not a torch checkpoint")
        return None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        problem = one_line(error)
    if owner:  # every rank decides alike from the same file; the lock's holder moves it
        last.replace(last.with_name(last.name + ".corrupt"))
    return f"{last} was unreadable ({problem}), moved to {last.name}.corrupt"


def checkpoints(directory: Path) -> list[Path]:
    """A run dir's checkpoints: last.ckpt (written at each epoch's end) and the hpc_ckpt_N.ckpt written there
    when fit is stopped (SIGTERM, or SLURM's requeue signal: `sbatch --signal=SIGUSR1@90`)."""
    return [p for p in (directory / LAST_CKPT, *directory.glob("hpc_ckpt_*.ckpt")) if p.is_file()]


def resume_point(directory: Path) -> Path | None:
    """An interrupted run's newest checkpoint in its run dir."""
    return max(checkpoints(directory), key=lambda p: p.stat().st_mtime_ns, default=None)


def load_record(directory: Path) -> tuple[dict | None, str | None]:
    """(the run's record or None, why an existing results.json is no record or None), from one read."""
    path = Path(directory) / RECORD
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:
        return None, one_line(error)
    return (record, None) if isinstance(record, dict) else (None, "not a JSON object")


def read_record(directory: Path) -> dict | None:
    """The run's record; None when there is none, RunDirError when results.json is no record."""
    record, problem = load_record(directory)
    if problem:
        raise RunDirError(f"cannot read {Path(directory) / RECORD}: {problem}")
    return record


def write_record(directory: Path, record: dict) -> None:
    """Atomic write: readers never see a half-written results.json."""
    write_atomic(Path(directory) / RECORD, (json.dumps(plain(record), indent=2, allow_nan=False) + "\n").encode())


def record_bytes(directory: Path) -> bytes:
    """The run's results.json exactly as written (for a byte copy); OSError when it cannot be read."""
    return (Path(directory) / RECORD).read_bytes()


def run_dirs(folder: Path) -> list[Path]:
    """The run directories right under `folder` that hold a results.json, sorted."""
    return sorted(path.parent for path in Path(folder).glob(f"*/{RECORD}"))


@contextlib.contextmanager
def held(directory: Path, shared: bool = False):
    """The run dir's lock for a writer outside fit, held for its whole work (its fd; None for a directory without
    a record: nothing to protect). A fit that starts meanwhile is refused; Busy when a fit holds it now. `shared`:
    a share of it (acquire_shared), which other shared writers of the same run hold at the same time."""
    if not (Path(directory) / RECORD).is_file():
        yield None
        return
    lock = acquire_shared(directory) if shared else acquire(directory)
    try:
        yield lock
    finally:
        release(lock)


def update_record(directory: Path, change, lock: int | None = None) -> dict:
    """Apply change(record) to the run's record under the run dir's lock (for writers outside fit; `lock`: the
    one this process holds already, from `held`).

    Busy when a fit holds the directory, RunDirError when there is no readable record; nothing written then.
    """
    if not (Path(directory) / RECORD).is_file():
        raise RunDirError(f"no {RECORD} in {directory}")
    own = lock is None
    lock = acquire(directory) if own else lock
    turn = os.open(Path(directory) / RECORD_TURN, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)  # writers sharing the lock read, change and write the record in turn
        record = read_record(directory)
        if record is None:
            raise RunDirError(f"no {RECORD} in {directory}")
        change(record)
        record["updated_at"] = now()  # so `vit-ablate table` copies the record again, with what was added
        write_record(directory, record)
        return record
    finally:
        os.close(turn)
        if own:
            release(lock)


def checkpoint_path(path: Path) -> Path:
    """A run dir's last.ckpt, or the given checkpoint file."""
    path = Path(path)
    return path / LAST_CKPT if path.is_dir() else path


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's plain content (weights-only loading); RunDirError for a missing or foreign file."""
    ckpt = checkpoint_path(path)
    if not ckpt.is_file():
        raise RunDirError(f"no checkpoint at {ckpt}")
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, not a zip/pickle, or pickled objects weights_only refuses
        raise RunDirError(f"cannot load checkpoint {ckpt}: {one_line(error)}") from None
    if not isinstance(state, dict) or not {"state_dict", "hyper_parameters"} <= set(state):
        raise RunDirError(f"cannot load checkpoint {ckpt}: not a `vit-ablate fit` checkpoint "
                          "(no state_dict and hyper_parameters)")
    state["hyper_parameters"] = trained_options(dict(state["hyper_parameters"]))  # one written before an option
    return state


def checkpoint_record(ckpt: Path) -> dict | None:
    """The record beside a checkpoint file (None: none there), RunDirError when it is unreadable."""
    return read_record(Path(ckpt).parent) if Path(ckpt).is_file() else None


def data_options(state: dict, record: dict | None) -> dict | None:
    """The data module options the run trained with: the checkpoint's, else its record's `data.*`."""
    options = state.get("datamodule_hyper_parameters")
    if options is None and record:
        options = {k.split(".", 1)[1]: v for k, v in (record.get("config") or {}).items() if k.startswith("data.")}
    return dict(options) if options is not None else None


class RunDir:
    """What fit found in its run directory once it held it; a context manager that releases the lock.

    previous: the record of an earlier attempt ({} when none); finished: that attempt completed or
    diverged; resume: the checkpoint to resume from (None: train from scratch); recovery: what was
    set aside, in one line (None when nothing was).
    """

    def __init__(self, path: Path, lock: int | None, previous: dict, resume: Path | None, recovery: str | None):
        self.path, self.lock, self.previous, self.resume, self.recovery = path, lock, previous, resume, recovery

    @property
    def finished(self) -> bool:
        return self.previous.get("status") in FINAL

    @classmethod
    def open(cls, path: Path, retrain: bool, owner: bool = True) -> RunDir:
        """Take the lock (when `owner`: DDP rank 0), set broken files aside, read the record, choose the resume point.

        Busy when another process holds the directory, OSError when it cannot be written; nothing changed then.
        A finished run (unless retrain) is left as it is; a fresh start removes its stale checkpoints and logs.
        """
        path = Path(path)
        lock = acquire(path) if owner else None
        try:
            return cls._found(path, lock, retrain, owner)
        except BaseException:
            if lock is not None:
                release(lock)
            raise

    @classmethod
    def _found(cls, path: Path, lock: int | None, retrain: bool, owner: bool) -> RunDir:
        previous, problem = load_record(path)
        dropped = []
        if problem:
            record = path / RECORD
            if owner:
                record.replace(record.with_name(RECORD + ".corrupt"))
            dropped.append(f"{record} was unreadable ({problem}), moved to {RECORD}.corrupt")
        run = cls(path, lock, previous or {}, None, None)
        if run.finished and not retrain:
            return run
        dropped += [note for note in (drop_corrupt_checkpoint(p, owner) for p in checkpoints(path)) if note]
        newest = resume_point(path)
        run.resume = newest if newest and not retrain else None
        if dropped:
            run.recovery = "; ".join(dropped) + (f"; resumed from {newest.name}" if run.resume else "; trained from scratch")
        if run.resume is None and owner:
            for stale in (LAST_CKPT, "metrics.csv", *(p.name for p in path.glob("hpc_ckpt_*.ckpt"))):
                (path / stale).unlink(missing_ok=True)  # a fresh start must not append to an old attempt
        return run

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            release(self.lock)
            self.lock = None
