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


def cli_options(parser) -> list[tuple[object, object]]:
    """(argparse action, its type hint or None) of every argument of a LightningCLI parser, in the parser's order.

    Private: argparse keeps its actions in `_actions` (there is no public list), and jsonargparse, which LightningCLI
    builds the parser with, keeps an option's type hint in `_typehint`; `vit-ablate docs` reads both to document
    every option of fit.
    """
    return [(action, getattr(action, "_typehint", None)) for action in parser._actions]


def epoch_batches_done(trainer: pl.Trainer) -> tuple[int, bool]:
    """(training batches done in the current epoch, whether that is the whole epoch), as a checkpoint taken now
    resumes them: Lightning's progress counters (public attributes of its private loop classes)."""
    done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
    return done, done >= trainer.num_training_batches


def restore_loader_states(trainer: pl.Trainer) -> bool:
    """Apply the checkpoint's train-loader states and make the epoch's iterator again; True when there were any.

    Private: Lightning applies them only when it builds the loader after reading the checkpoint; a module whose
    optimizer asks for `trainer.estimated_stepping_batches` has the loader (and its iterator) built before that,
    and the states would wait unused in the fit loop.
    """
    loop = trainer.fit_loop
    states, loader = loop._combined_loader_states_to_load, loop._combined_loader
    if not states or loader is None or loop._data_fetcher is None:
        return False
    loader._load_state_dicts(states)
    loop._combined_loader_states_to_load = []
    iter(loop._data_fetcher)  # the resumed epoch's iterator, starting where the checkpoint's epoch stopped
    return True
