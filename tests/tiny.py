"""The smallest ViT that trains, for every test that runs `vit-ablate fit` (each test names its own budget), and
how a test reads the steps a run trained."""

import csv
from pathlib import Path

TINY_MODEL = ["--model.width=32", "--model.depth=1", "--model.heads=2", "--model.mlp_dim=64", "--data.batch_size=16",
              "--trainer.num_sanity_val_steps=0", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]


def steps_logged(run_dir: Path) -> list[int]:
    """The training steps metrics.csv holds a train/loss_step row for, in file order."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss_step")]
