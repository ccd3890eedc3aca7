"""A trained run, back from its directory or checkpoint: the model, its data and its record.

Few-shot evaluation and the analysis figures start here, so a run is read one way: the checkpoint
(weights-only) and the record beside it, both read by rundir, then the data the run saw (the
checkpoint's data options, else the record's `data.*`), with any options the caller changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from vit_lightning.core.checks import one_line
from vit_lightning.run.rundir import RunDirError, checkpoint_path, checkpoint_record, data_options, read_checkpoint


class TrainedError(ValueError):
    """A run that cannot be loaded; the message is one line naming the problem."""


class Trained(NamedTuple):
    """A trained run: the Classifier (eval mode), its data module (None unless asked), its record (None: none)."""

    model: Any
    data: Any
    record: dict | None
    checkpoint: Path
    data_options: dict | None  # the data module options the run trained with (None: unknown)


def load_trained(path: Path, data: bool = True, **changes) -> Trained:
    """The run at `path` (run dir or .ckpt): model, set-up data module (with `changes` to its options), record."""
    from vit_lightning.run.module import Classifier

    ckpt = checkpoint_path(path)
    try:
        record = checkpoint_record(ckpt)
        state = read_checkpoint(ckpt)
    except RunDirError as error:
        raise TrainedError(str(error)) from None
    try:
        model = Classifier(**state["hyper_parameters"])
        model.load_state_dict(state["state_dict"])
    except (TypeError, ValueError, RuntimeError, KeyError) as error:
        raise TrainedError(f"cannot load checkpoint {ckpt}: it does not fit this version's model: "
                           f"{one_line(error)}") from None
    model.eval()
    options = data_options(state, record)
    return Trained(model, build_data(options, **changes) if data else None, record, ckpt, options)


def build_data(options: dict | None, **changes):
    """A ImageDataModule of a run's data options, set up for validation, with `changes` (None values: kept)."""
    from vit_lightning.data.datamodule import ImageDataModule

    if options is None:
        raise TrainedError("the checkpoint names no data and no results.json is beside it")
    options = {**options, **{k: v for k, v in changes.items() if v is not None}}
    try:
        datamodule = ImageDataModule(**options)
        datamodule.setup("validate")
    except (TypeError, ValueError, OSError, RuntimeError) as error:
        raise TrainedError(f"cannot load the run's data: {one_line(error)}") from None
    return datamodule
