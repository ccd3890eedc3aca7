"""What fit does about broken files in its run dir: checkpoints written atomically, corrupt ones set aside.

A run's resume point must survive a full disk and a kill mid-write, and a file that did get
truncated (copied by hand, a disk that failed) must never stop the run for good: fit moves it
aside as `<name>.corrupt`, says so in one line and in the record, and goes on from what is left
(the checkpoint carries the record's history; without a checkpoint the run starts over).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.rank_zero import rank_zero_only

from vit_lightning.bookkeeping import RECORD, one_line, write_atomic
from vit_lightning.record import record_problem


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoints, written through a temp file in the same folder and renamed.

    Lightning's own save copies a temp file over the target, which truncates the last good
    checkpoint when the disk fills up; here a failed save leaves the old one and no temp file.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's own way
            return super().save_checkpoint(checkpoint, path, storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_atomic(Path(path), buffer.getbuffer())


def use_atomic_checkpoints(strategy) -> None:
    """Give the trainer's strategy our checkpoint writer, unless the user configured one of their own."""
    if getattr(strategy, "_checkpoint_io", None) is None or type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()


def drop_corrupt_checkpoint(last: Path) -> str | None:
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
    if rank_zero_only.rank == 0:  # every rank decides alike from the same file; one moves it
        last.replace(last.with_name(last.name + ".corrupt"))
    return f"{last} was unreadable ({problem}), moved to {last.name}.corrupt"


def drop_corrupt_record(directory: Path) -> str | None:
    """Move an unreadable results.json aside (the checkpoint carries its history); what was done, or None."""
    if (problem := record_problem(directory)) is None:
        return None
    path = directory / RECORD
    if rank_zero_only.rank == 0:
        path.replace(path.with_name(RECORD + ".corrupt"))
    return f"{path} was unreadable ({problem}), moved to {RECORD}.corrupt"
