"""Test configuration: W&B never talks to a server, nothing uses more threads than CI has, shared fixtures."""

import os
import signal

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

# A shell starts a background job with SIGINT ignored, and Python then installs no KeyboardInterrupt handler, in
# this process or in the fits the tests start: Ctrl-C tests would see a run that ignores SIGINT. Give them a terminal's.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


import contextlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402
from tiny import TINY_MODEL  # noqa: E402  (tests/tiny.py: the smallest ViT that trains)


@contextlib.contextmanager
def _tmpfs(path, options: str):
    """A tmpfs mounted at path for the with-block; yields False where this machine cannot mount one."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def readonly_dir(tmp_path):
    """A directory nobody may write into: a read-only tmpfs, or (not root) one without write permission."""
    path = tmp_path / "readonly"
    with _tmpfs(path, "ro,size=64k") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("root cannot make a read-only directory without mounting one")
            path.chmod(0o555)
        yield path
        if not mounted:
            path.chmod(0o755)


@pytest.fixture
def small_disk(tmp_path):
    """(directory, mounted): a 200 KiB tmpfs with 80 KiB free, or a plain directory (mounted False) where
    this machine cannot mount one; the test then simulates the full disk."""
    path = tmp_path / "small"
    with _tmpfs(path, "size=200k") as mounted:
        if mounted:
            (path / "filler").write_bytes(bytes(120 * 1024))
        yield path, mounted


@pytest.fixture
def tiny_fit():
    """tiny_fit(train_batches, val_batches, *more): fit's argv for the tiny model on that many batches per epoch."""
    def argv(train_batches: int = 2, val_batches: int = 1, *more: str) -> list[str]:
        return [*TINY_MODEL, f"--trainer.limit_train_batches={train_batches}",
                f"--trainer.limit_val_batches={val_batches}", *more]
    return argv


@pytest.fixture
def only_record():
    """only_record(root): (path, record) of the one run record under a run root; fails if there is not exactly one."""
    def read(root):
        paths = sorted(root.glob("*/*/*/results.json"))
        assert len(paths) == 1, f"expected one run record under {root}, found {[str(p) for p in paths]}"
        return paths[0], json.loads(paths[0].read_text())
    return read
