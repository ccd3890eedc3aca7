"""A trained run, back from its directory or checkpoint: the model, its data and its record.

Few-shot evaluation, the analysis figures, `vit-ablate eval` and transfer all start here, so a run is
read one way: the checkpoint (weights-only), then the record beside it, then the data the run saw
(the checkpoint's data options, else the record's `data.*`), with any options the caller changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from vit_lightning.bookkeeping import LAST_CKPT, RECORD, one_line

CHECKPOINT = LAST_CKPT  # the checkpoint of a run directory


class TrainedError(ValueError):
    """A run that cannot be loaded; the message is one line naming the problem."""


class Trained(NamedTuple):
    """A trained run: the ViTClassifier (eval mode), its data module (None unless asked), its record (None: none)."""

    model: Any
    data: Any
    record: dict | None
    checkpoint: Path
    data_options: dict | None  # the data module options the run trained with (None: unknown)


def checkpoint_path(path: Path) -> Path:
    """A run dir's last.ckpt, or the given checkpoint file."""
    path = Path(path)
    return path / CHECKPOINT if path.is_dir() else path


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's plain content (weights-only loading); TrainedError for a missing or foreign file."""
    ckpt = checkpoint_path(path)
    if not ckpt.is_file():
        raise TrainedError(f"no checkpoint at {ckpt}")
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, not a zip/pickle, or pickled objects weights_only refuses
        raise TrainedError(f"cannot load checkpoint {ckpt}: {one_line(error)}") from None
    if not isinstance(state, dict) or not {"state_dict", "hyper_parameters"} <= set(state):
        raise TrainedError(f"cannot load checkpoint {ckpt}: not a `vit-ablate fit` checkpoint "
                           "(no state_dict and hyper_parameters)")
    return state


def read_run_record(ckpt: Path) -> dict | None:
    """The results.json beside a checkpoint; None when there is none, TrainedError when it is unreadable."""
    path = Path(ckpt).parent / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TrainedError(f"cannot read {path}: {one_line(error)}") from None
    if not isinstance(record, dict):
        raise TrainedError(f"cannot read {path}: not a JSON object")
    return record


def data_options(state: dict, record: dict | None) -> dict | None:
    """The data module options the run trained with: the checkpoint's, else its record's `data.*`."""
    options = state.get("datamodule_hyper_parameters")
    if options is None and record:
        options = {k.split(".", 1)[1]: v for k, v in (record.get("config") or {}).items() if k.startswith("data.")}
    return dict(options) if options is not None else None


def load_trained(path: Path, data: bool = True, **changes) -> Trained:
    """The run at `path` (run dir or .ckpt): model, set-up data module (with `changes` to its options), record."""
    from vit_lightning.module import ViTClassifier

    ckpt = checkpoint_path(path)
    record = read_run_record(ckpt) if ckpt.is_file() else None
    state = read_checkpoint(ckpt)
    try:
        model = ViTClassifier(**state["hyper_parameters"])
        model.load_state_dict(state["state_dict"])
    except (TypeError, ValueError, RuntimeError, KeyError) as error:
        raise TrainedError(f"cannot load checkpoint {ckpt}: it does not fit this version's model: "
                           f"{one_line(error)}") from None
    model.eval()
    options = data_options(state, record)
    return Trained(model, build_data(options, **changes) if data else None, record, ckpt, options)


def build_data(options: dict | None, **changes):
    """A ViTDataModule of a run's data options, set up for validation, with `changes` (None values: kept)."""
    from vit_lightning.data import ViTDataModule

    if options is None:
        raise TrainedError("the checkpoint names no data and no results.json is beside it")
    options = {**options, **{k: v for k, v in changes.items() if v is not None}}
    try:
        datamodule = ViTDataModule(**options)
        datamodule.setup("validate")
    except (TypeError, ValueError, OSError, RuntimeError) as error:
        raise TrainedError(f"cannot load the run's data: {one_line(error)}") from None
    return datamodule
