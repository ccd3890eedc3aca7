"""Test configuration: W&B never talks to a server and nothing uses more threads than CI has."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


import contextlib  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402


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
