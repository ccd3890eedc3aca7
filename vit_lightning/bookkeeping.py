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


def now() -> str:
    """The current UTC time as ISO text, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path via a temp file in the same folder, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


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
