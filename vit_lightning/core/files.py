"""Atomic writes and timestamps: a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once, at import (setting it is process-wide)


def now() -> str:
    """The current UTC time as ISO text, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path via a temp file in the same folder, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~UMASK)  # as open() would have made it (mkstemp makes it private)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:  # disk full, quota, interrupted: leave no temp file behind
        Path(tmp).unlink(missing_ok=True)
        raise
