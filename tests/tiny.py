"""The smallest ViT that trains, for every test that runs `vit-ablate fit` (each test names its own budget), and
how a test reads the steps a run trained and waits for what a process does."""

import csv
import time
from pathlib import Path

TINY_MODEL = ["--model.width=32", "--model.depth=1", "--model.heads=2", "--model.mlp_dim=64", "--data.batch_size=16",
              "--trainer.num_sanity_val_steps=0", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]


def tiny_settings() -> dict:
    """TINY_MODEL as a sweep's fixed settings ({key: value}), each value read as the command line reads it."""
    import yaml

    return {arg[2:].split("=")[0]: yaml.safe_load(arg.split("=", 1)[1]) for arg in TINY_MODEL}


def steps_logged(run_dir: Path) -> list[int]:
    """The training steps metrics.csv holds a train/loss_step row for, in file order."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss_step")]


def wait_for(condition, timeout: float, what: str, poll: float = 0.1):
    """condition()'s first truthy value, polled every `poll` seconds; TimeoutError(what) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll)
    raise TimeoutError(what)
