"""Callbacks of `vit-ablate fit`: divergence stop, stop signals, per-epoch reseeding, progress lines, config to loggers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader
from typing_extensions import override

from vit_lightning.compat.lightning import cluster_environment, request_graceful_stop
from vit_lightning.run.rng import rng_states, set_rng_states


class DivergenceStop(pl.Callback):
    """Stops every rank together once any rank saw a non-finite training loss; `diverged` says whether it did.

    Each step only folds the loss into a device flag; the flag is read (and agreed on across ranks)
    every `log_every_n_steps` steps and at the end of each epoch, so the check costs no sync per step.
    """

    def __init__(self):
        self.diverged = False
        self._bad: torch.Tensor | None = None  # a non-finite loss since the last check, on the device

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = ~torch.isfinite(loss.detach())
        self._bad = bad if self._bad is None else self._bad | bad
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0 or trainer.is_last_batch:
            self._check(trainer)

    @override
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
    if isinstance(exception, SIGTERMException):  # StopSignal names the signal it stopped on (SLURM's SIGUSR1)
        return getattr(exception, "signum", signal.SIGTERM)
    if isinstance(exception, KeyboardInterrupt):
        return signal.SIGINT
    return None


class StopSignal(pl.Callback):
    """Stops every DDP rank at the same step on SIGTERM or SLURM's requeue signal, with a checkpoint taken there.

    Lightning's own handlers act inside the signal handler: its SIGTERM handler broadcasts and its SLURM
    requeue (SIGUSR1) handler saves a checkpoint, which ends in a barrier. SLURM signals the ranks about a
    second apart, so that collective meets another one (the gradient all-reduce) and the ranks wait for
    each other until the DDP timeout; and a SIGTERM Lightning notes after this callback's hook is acted on
    with no checkpoint. Here the handlers only note the signal; after each training step
    the ranks agree on it, all save `hpc_ckpt_N.ckpt` at that step (the resume point: a stop loses no
    step) and stop through Lightning's graceful stop (SIGTERMException). After the requeue signal,
    `requeue()` (called by fit once the run is written) puts the SLURM job back in the queue.
    A completed run removes its stop checkpoints: its last.ckpt is newer.
    """

    def __init__(self):
        self.signum: int | None = None  # the signal that stopped fit, for its exit code
        self.requeue_signum: int | None = None  # SLURM's requeue signal, when Lightning would requeue
        self._requested = 0  # 1: SIGTERM noted, 2: the requeue signal noted

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        self.requeue_signum = requeue_signal(trainer)
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._request)  # after Lightning's; it restores the original at teardown
        if self.requeue_signum is not None:
            signal.signal(self.requeue_signum, self._request)

    def _request(self, signum, frame) -> None:
        self._requested = max(self._requested, 2 if signum == self.requeue_signum else 1)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        agreed = max(self._requested, 1 if trainer.received_sigterm else 0)
        if trainer.world_size > 1:
            flag = torch.tensor([agreed], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            agreed = int(flag.item())
        if not agreed:
            return
        self.signum = self.requeue_signum if agreed == 2 else signal.SIGTERM
        directory = Path(trainer.default_root_dir)
        path = next_stop_checkpoint(directory)
        trainer.save_checkpoint(path)  # every rank, at this step; the save ends in a barrier
        if trainer.is_global_zero:
            drop_stop_checkpoints(directory, keep=path)
            print(f"stopped by {signal.Signals(self.signum).name} at step {trainer.global_step}; "
                  f"checkpoint {path}", flush=True)
        request_graceful_stop(trainer)  # on every rank at this step: they stop together once the step is logged

    @override
    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            drop_stop_checkpoints(Path(trainer.default_root_dir))

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.signum = self.signum or stop_signal(exception)
        if isinstance(exception, SIGTERMException):  # for the record, which reads the signal from the exception
            exception.signum = self.signum

    def requeue(self) -> None:
        """After the requeue signal stopped fit: `scontrol requeue` this job (rank 0), as Lightning would."""
        if self.signum is None or self.signum != self.requeue_signum or rank_zero_only.rank != 0:
            return
        job = os.environ.get("SLURM_JOB_ID", "")
        if os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # everything is written; SLURM now ends this job's processes
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if done.returncode:
            print(f"vit-ablate fit: scontrol requeue {job} failed: {' '.join(done.stderr.split())}",
                  file=sys.stderr, flush=True)
        else:
            print(f"vit-ablate fit: requeued SLURM job {job}", file=sys.stderr, flush=True)


def requeue_signal(trainer: pl.Trainer) -> int | None:
    """The signal SLURM sends before a time limit when Lightning is to requeue the job (SIGUSR1), else None."""
    environment = cluster_environment(trainer)
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal
    return None


def next_stop_checkpoint(directory: Path) -> Path:
    """hpc_ckpt_{N+1}.ckpt after the highest N in directory, the name Lightning gives its SLURM requeue checkpoint."""
    numbers = [int(p.stem.rsplit("_", 1)[1]) for p in directory.glob("hpc_ckpt_*.ckpt") if p.stem.rsplit("_", 1)[1].isdigit()]
    return directory / f"hpc_ckpt_{max(numbers, default=0) + 1}.ckpt"


def drop_stop_checkpoints(directory: Path, keep: Path | None = None) -> None:
    """Remove a run dir's stop checkpoints (hpc_ckpt_N.ckpt) but `keep`."""
    for path in directory.glob("hpc_ckpt_*.ckpt"):
        if keep is None or path.name != keep.name:
            path.unlink(missing_ok=True)


class ConfigToLoggers(pl.Callback):
    """Logs the flat run config (the sweep's keys) as hyperparameters: hparams.yaml and the W&B run config.

    Lightning's own hparams logging is off in `fit`: the model's and the data's hparams both hold
    img_size (linked, with different values) and are not the keys a sweep uses.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config

    @override
    def on_fit_start(self, trainer, pl_module) -> None:
        for logger in trainer.loggers:  # loggers write on rank 0 only
            logger.log_hyperparams(self.config)


class EpochSeed(pl.Callback):
    """Reseed all RNGs from (seed, epoch, rank) at each epoch start, and carry them in the checkpoint: a run resumed
    at an epoch's start or in its middle draws what an unbroken one does.

    Lightning creates an epoch's loader iterator after `on_train_epoch_start`, except for the first epoch a
    process trains (created earlier, to count batches); creating it draws a worker base seed from the global
    RNG, so the loaders get a private generator for that, and augmentation draws the same numbers either way (the
    training order is the sampler's own, from (seed, epoch): data/resumable.py). A checkpoint holds every rank's
    generators as the step it was taken at left them (a sized loader fetches no batch ahead, so no draw of the next
    step has happened yet); a fit resumed mid-epoch, which has no `on_train_epoch_start`, puts them back when it
    starts training. Loader workers draw from generators seeded by each batch's place in the epoch instead
    (data/resumable.py PlacedDraws), so a resume is exact with any number of them.
    """

    def __init__(self, seed):
        self.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
        self._trainer: pl.Trainer | None = None
        self._resumed: list | None = None  # each rank's generators from the checkpoint, until training starts

    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    @override
    def state_dict(self) -> dict:
        states, trainer = rng_states(), self._trainer
        if trainer is not None and trainer.world_size > 1:  # every rank saves; rank 0's copy is the one written
            gathered: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, states)
            return {"ranks": gathered}
        return {"ranks": [states]}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        self._resumed = list(state_dict.get("ranks") or []) or None

    @override
    def on_fit_start(self, trainer, pl_module) -> None:
        for loader in _loaders(trainer.train_dataloader):
            if loader.generator is None:
                loader.generator = torch.Generator().manual_seed(self.seed or 0)

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed and len(resumed) == trainer.world_size:  # an epoch that starts anew reseeds itself after this
            set_rng_states(resumed[trainer.global_rank])

    @override
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


class EpochClock(pl.Callback):
    """`_tick`: when this training epoch (or a resumed fit, mid-epoch) started."""

    _tick = 0.0

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()  # an epoch resumed mid-way has no on_train_epoch_start

    @override
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()


class EpochPrinter(EpochClock):
    """One plain line per epoch, for logs (used instead of a progress bar when stdout is not a terminal)."""

    @override
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        shown = " ".join(f"{k}={float(metrics[k]):.4f}" for k in ("train/loss", "val/loss", "val/acc") if k in metrics)
        took = time.perf_counter() - self._tick
        of = f"/{trainer.max_epochs}" if (trainer.max_epochs or 0) > 0 else ""
        print(f"epoch {trainer.current_epoch + 1}{of} {shown} ({took:.1f}s)", flush=True)
