"""Run bookkeeping shared by `fit`, the sweep runner and the tables; imports nothing heavy."""

from __future__ import annotations

import netrc
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

RUN_DEFAULTS = {"run.root": "runs", "run.ablation": "adhoc", "run.profile": "local"}  # fit's --run.* defaults
RECORD = "results.json"  # a run's record, in its run directory
FINAL = ("completed", "diverged")  # record statuses that end a run: a re-run skips it unless asked to retrain


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


def one_line(error: BaseException) -> str:
    """An error as 'TypeName: message' on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def describe(error: OSError) -> str:
    """An OSError in one line, naming the file: 'runs/x/results.json: No space left on device'."""
    name = f"{error.filename}: " if error.filename else ""
    return f"{name}{error.strerror or ' '.join(str(error).split()) or type(error).__name__}"


def wandb_credentials(env=None, netrc_path: str | Path | None = None) -> bool:
    """W&B can log in without asking: WANDB_API_KEY is set, or a netrc file has an entry for the W&B host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = Path(netrc_path) if netrc_path else Path(env.get("NETRC", Path.home() / ".netrc"))
    try:
        return path.is_file() and netrc.netrc(str(path)).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError):
        return False
