"""Every random generator a training step draws from (Python's, NumPy's, torch's CPU and CUDA ones), as plain values
a checkpoint holds (it still loads with weights_only=True), and back."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_states() -> dict:
    """The generators' states now: crops, flips, RandAugment and mixing draw from the CPU ones, dropout from the
    device's (this process's current CUDA device: each DDP rank trains on one)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
            "python": [version, list(internal), gauss_next]}


def set_rng_states(states: dict) -> None:
    """Put the generators back where `rng_states()` found them (CUDA's: this process's device's, where it has one)."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda[0])  # the current device: each DDP rank trains on its own
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
