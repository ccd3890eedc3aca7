"""Callbacks of `vit-ablate fit`: divergence stop, stop signals, per-epoch reseeding, progress lines, config to loggers."""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader


class DivergenceStop(pl.Callback):
    """Stops every rank together once any rank saw a non-finite training loss; `diverged` says whether it did.

    Each step only folds the loss into a device flag; the flag is read (and agreed on across ranks)
    every `log_every_n_steps` steps and at the end of each epoch, so the check costs no sync per step.
    """

    def __init__(self):
        self.diverged = False
        self._bad: torch.Tensor | None = None  # a non-finite loss since the last check, on the device

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = ~torch.isfinite(loss.detach())
        self._bad = bad if self._bad is None else self._bad | bad
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0 or trainer.is_last_batch:
            self._check(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._check(trainer)

    def _check(self, trainer: pl.Trainer) -> None:
        bad = bool(self._bad.item()) if self._bad is not None else False
        self._bad = None
        if trainer.world_size > 1:  # every rank takes part, so all of them stop at the same step
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad and not self.diverged:
            self.diverged = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"non-finite loss at step {trainer.global_step}: stopping; the run is recorded as diverged",
                      flush=True)


def stop_signal(exception: BaseException) -> int | None:
    """The signal an exception out of fit stands for: SIGTERM (Lightning's SIGTERMException), SIGINT (Ctrl-C)."""
    if isinstance(exception, SIGTERMException):
        return signal.SIGTERM
    if isinstance(exception, KeyboardInterrupt):
        return signal.SIGINT
    return None


class StopSignal(pl.Callback):
    """Stops every DDP rank at the same step on SIGTERM; remembers the signal that stopped fit, for its exit code.

    Lightning's own SIGTERM handler broadcasts from inside the handler; when every rank gets the
    signal (a process group, a scheduler) that broadcast meets the wrong collective and the ranks
    wait for each other until the DDP timeout. Under DDP this handler only notes the request; the
    ranks agree on it after each training step and all stop there, through Lightning's graceful
    stop (SIGTERMException). One process keeps Lightning's handler.
    """

    def __init__(self):
        self.signum: int | None = None
        self._requested = False

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.world_size > 1 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._request)  # after Lightning's; it restores the original at teardown

    def _request(self, signum, frame) -> None:
        self._requested = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(self._requested, all=False):
            trainer._signal_connector.received_sigterm = True  # on every rank at this step: they stop together

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.signum = self.signum or stop_signal(exception)


class ConfigToLoggers(pl.Callback):
    """Logs the flat run config (the sweep's keys) as hyperparameters: hparams.yaml and the W&B run config.

    Lightning's own hparams logging is off in `fit`: the model's and the data's hparams both hold
    img_size (linked, with different values) and are not the keys a sweep uses.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def on_fit_start(self, trainer, pl_module) -> None:
        for logger in trainer.loggers:  # loggers write on rank 0 only
            logger.log_hyperparams(self.config)


class EpochSeed(pl.Callback):
    """Reseed all RNGs from (seed, epoch, rank) at each epoch start: a resumed run draws what an unbroken one does.

    Lightning creates an epoch's loader iterator after `on_train_epoch_start`, except for the first epoch a
    process trains (created earlier, to count batches); creating it draws a worker base seed from the global
    RNG, so the loaders get a private generator for that, and shuffling and augmentation draw the same numbers
    either way. Exact for in-memory data (num_workers=0); worker processes seed themselves.
    """

    def __init__(self, seed):
        self.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    def on_fit_start(self, trainer, pl_module) -> None:
        for loader in _loaders(trainer.train_dataloader):
            if loader.generator is None:
                loader.generator = torch.Generator().manual_seed(self.seed or 0)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.seed is None:
            return
        seed = (self.seed * 1_000_003 + trainer.current_epoch * 1_009 + trainer.global_rank) % 2**32
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)  # also seeds every CUDA device


def _loaders(tree) -> list[DataLoader]:
    if isinstance(tree, DataLoader):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [loader for item in tree for loader in _loaders(item)] if isinstance(tree, (list, tuple)) else []


class EpochPrinter(pl.Callback):
    """One plain line per epoch, for logs (used instead of a progress bar when stdout is not a terminal)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        shown = " ".join(f"{k}={float(metrics[k]):.4f}" for k in ("train/loss", "val/loss", "val/acc") if k in metrics)
        took = time.perf_counter() - self._start
        of = f"/{trainer.max_epochs}" if (trainer.max_epochs or 0) > 0 else ""
        print(f"epoch {trainer.current_epoch + 1}{of} {shown} ({took:.1f}s)", flush=True)
