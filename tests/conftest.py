"""Test configuration: W&B never talks to a server and nothing uses more threads than CI has."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
