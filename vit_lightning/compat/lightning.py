"""Lightning's private trainer and strategy attributes the run relies on (lightning < 2.7, pyproject.toml)."""

from __future__ import annotations

from datetime import timedelta

import lightning.pytorch as pl


def cluster_environment(trainer: pl.Trainer):
    """The cluster environment Lightning chose (SLURM, torchelastic, ...), also for a single-device strategy.

    Private: only parallel strategies expose theirs (`trainer.strategy.cluster_environment`); the
    accelerator connector holds it for every strategy, with the user's `plugins=` applied.
    """
    return trainer._accelerator_connector.cluster_environment


def request_graceful_stop(trainer: pl.Trainer) -> None:
    """Have Lightning stop fit after the current step, as on SIGTERM: the step logged, then SIGTERMException.

    Private: only Lightning's own SIGTERM handler sets the flag (`trainer.received_sigterm` is read-only);
    raising SIGTERMException from a callback instead would skip the step's logging and scheduler update.
    """
    trainer._signal_connector.received_sigterm = True


def set_collective_timeout(strategy, seconds: float) -> None:
    """How long a DDP/FSDP collective waits for a silent rank; read when the process group starts.

    Private: `DDPStrategy(timeout=...)` is public, but `Trainer(strategy="auto" | "ddp", devices=N)` builds the
    strategy itself from a string, and the timeout of one it built has no public setter.
    """
    if hasattr(strategy, "_timeout"):
        strategy._timeout = timedelta(seconds=seconds)


def loop_classes() -> tuple[type, type]:
    """(training epoch loop, evaluation loop) classes, which bench/trial_split.py times; private in Lightning."""
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    return _TrainingEpochLoop, _EvaluationLoop


def append_help(parser, additions: dict[str, str]) -> None:
    """Add text to the `--help` of options of LightningCLI's parser (by dest); argparse keeps them in `_actions`."""
    for action in parser._actions:
        if action.dest in additions:
            action.help = f"{(action.help or '').rstrip()} {additions[action.dest]}"
