"""`vit-ablate fit`: train one run (LightningCLI) and keep its record in {run.root}/{ablation}/{profile}/{name}/."""

from __future__ import annotations

import csv
import importlib.util
import logging
import os
import random
import sys
import time
import warnings
from argparse import ArgumentError
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from torch.utils.data import DataLoader

from vit_lightning import fewshot
from vit_lightning.bookkeeping import FINAL, RUN_DEFAULTS, wandb_credentials
from vit_lightning.data import ViTDataModule
from vit_lightning.module import ViTClassifier
from vit_lightning.identity import flatten, normalize, run_dir
from vit_lightning.record import RECORD, RunRecord, read_record

# Demo defaults (with ViTClassifier's patch_size=7, lr=2e-3 and batches of 32): micro on mnist5k
# reaches about 90% val acc in 12 epochs, under a minute on 2 CPU cores. GPU users add --trainer.precision=bf16-mixed (and
# --trainer.deterministic=true for bitwise repeats); CPU kernels repeat exactly for a fixed seed already.
TRAINER_DEFAULTS = {"max_epochs": 12, "gradient_clip_val": 1.0, "log_every_n_steps": 10}
LINKED = ("num_classes", "in_chans", "img_size")  # data -> model, at instantiation
WANDB_MODES = ("auto", "online", "offline", "off")


class FitCLI(LightningCLI):
    """LightningCLI over ViTClassifier + ViTDataModule with a `--run.*` group; builds the trainer into the run dir."""

    def __init__(self, argv: list[str]):
        super().__init__(
            ViTClassifier, ViTDataModule, args=argv, run=False, seed_everything_default=0,
            trainer_defaults=TRAINER_DEFAULTS, save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False, "prog": "vit-ablate fit"},
            auto_configure_optimizers=False, load_from_checkpoint_support=False,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run.root", type=str, default=RUN_DEFAULTS["run.root"],
                            help="Directory that holds all run records.")
        parser.add_argument("--run.ablation", type=str, default=RUN_DEFAULTS["run.ablation"],
                            help="Ablation this run belongs to.")
        parser.add_argument("--run.profile", type=str, default=RUN_DEFAULTS["run.profile"],
                            help="Profile (demo, cifar10, ...).")
        parser.add_argument("--run.trial", type=str | None, default=None,
                            help="Run directory name given by the sweep runner (default: from the config).")
        parser.add_argument("--run.retrain", type=bool, default=False, help="Train again even if completed.")
        parser.add_argument("--run.wandb", type=Literal[WANDB_MODES], default="auto",
                            help="auto: on under a W&B agent or with credentials (offline without them).")
        parser.add_argument("--run.wandb_project", type=str | None, default=None, help="W&B project.")
        parser.add_argument("--run.fewshot_shots", type=list[int], default=list(fewshot.SHOTS),
                            help="k of the few-shot linear evaluation at the end of fit ([]: none).")
        parser.add_argument("--run.fewshot_every", type=int, default=0,
                            help="Also evaluate few-shot every N epochs (0: only at the end).")
        parser.set_defaults({"data.batch_size": 32})  # the CPU demo: many small steps suit a small ViT
        for key in LINKED:
            parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")

    def parse_arguments(self, parser, args) -> None:
        self.config = parser.parse_args(args)  # no sys.argv cross-check: argv comes from the dispatcher

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        """Trainer whose logs, checkpoint and record all live in the run dir (nothing is written until fit)."""
        # normalised once (`--trainer.devices=2` parses as "2", YAML `devices: 2` as 2): the name, record and loggers agree
        config = normalize(flatten({k: v for k, v in self.config.as_dict().items() if k != "config"}))
        config.update({f"model.{key}": getattr(self.datamodule, key) for key in LINKED})
        self.run_dir = directory = run_dir(config)
        self.record = RunRecord(directory, config)
        shots = config["run.fewshot_shots"]
        tty = sys.stdout.isatty()
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = [
            # One checkpoint, overwritten every epoch: {run dir}/last.ckpt (resume point, final weights).
            ModelCheckpoint(dirpath=directory, filename="last", save_top_k=1, save_on_train_epoch_end=True,
                            enable_version_counter=False),
            *([fewshot.FewShotEval(shots, config["run.fewshot_every"])] if shots else []),  # before the record
            self.record,
            EpochSeed(config.get("seed_everything")),
            RichProgressBar() if tty else EpochPrinter(),
        ]
        # The record logs the flat config as hparams itself (module + data hparams would clash on img_size).
        kwargs.update(logger=make_loggers(directory, config), enable_autolog_hparams=False,
                      enable_progress_bar=tty and trainer_config.get("enable_progress_bar") is not False)
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer({**trainer_config, **kwargs}, extra + callbacks)

    def fit_run(self, argv: list[str]) -> int:
        """Skip a finished run, resume an unfinished one from last.ckpt, or start it."""
        directory, retrain = self.run_dir, self.record.config["run.retrain"]
        previous = read_record(directory)
        if previous and previous.get("status") in FINAL and not retrain:
            _say(f"vit-ablate fit: skipped, run already {previous['status']}; record: {directory / RECORD}")
            return 0
        last = directory / "last.ckpt"
        ckpt_path = str(last) if last.is_file() and not retrain else None
        if ckpt_path is None and rank_zero_only.rank == 0:
            for stale in ("last.ckpt", "metrics.csv"):  # a fresh start must not append to an old attempt
                (directory / stale).unlink(missing_ok=True)
        _say(f"vit-ablate fit: {'resuming from ' + ckpt_path if ckpt_path else 'run dir ' + str(directory)}")
        try:
            with _relaunchable(argv):
                self.trainer.fit(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
        finally:
            _finish_wandb(self.trainer)
        if self.record.diverged:
            _say(f"vit-ablate fit: diverged (non-finite loss); record: {directory / RECORD}")
        return 0


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


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, but an existing metrics.csv is continued (resume), not deleted."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class RunCSVLogger(CSVLogger):
    """CSVLogger writing metrics.csv and hparams.yaml straight into the run dir."""

    def __init__(self, directory: Path):
        super().__init__(directory, name="", version="")

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def wandb_mode(choice: str) -> str | None:
    """auto: on under a W&B agent or with credentials; offline when there are no credentials; None = off."""
    if choice in ("online", "offline"):
        return choice
    if choice == "off" or os.environ.get("WANDB_MODE") == "disabled":
        return None
    credentials = wandb_credentials()
    if os.environ.get("WANDB_SWEEP_ID") or credentials:
        return "online" if credentials and os.environ.get("WANDB_MODE") != "offline" else "offline"
    return None


def make_loggers(directory: Path, config: dict) -> list:
    """CSV always; W&B (Lightning's WandbLogger, which creates the run on rank 0 only) when enabled."""
    loggers: list = [RunCSVLogger(directory)]
    mode = wandb_mode(config["run.wandb"])
    if mode:
        project = config["run.wandb_project"] or os.environ.get("WANDB_PROJECT", "vit-lightning")
        extra, previous = {}, read_record(directory) or {}
        run_id = (previous.get("wandb") or {}).get("run_id")
        resuming = previous.get("status") not in FINAL and not config["run.retrain"]
        if run_id and resuming and not os.environ.get("WANDB_RUN_ID"):  # an agent names its own runs
            extra = {"id": run_id, "resume": "allow"}  # continue the interrupted attempt's W&B run
        loggers.append(WandbLogger(
            name=directory.name, save_dir=str(directory), project=project, offline=mode == "offline",
            group=config["run.ablation"], tags=[config["run.ablation"], config["run.profile"]], **extra,
        ))
    return loggers


def _finish_wandb(trainer: pl.Trainer) -> None:
    """Close the W&B run Lightning opened, so a later fit in this process starts its own."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero and logger._experiment is not None:
            failed = trainer.state.status.value == "interrupted"
            logger.experiment.finish(exit_code=1 if failed else 0)


@contextmanager
def _relaunchable(argv: list[str]):
    """Lightning's ddp launcher re-executes sys.argv (or `python -m <__main__>`): make that this fit command."""
    import __main__

    if sys.argv[1:] == ["fit", *argv]:
        yield  # started as `vit-ablate fit ...` or `python -m vit_lightning.cli fit ...`
        return
    saved = sys.argv, getattr(__main__, "__spec__", None)
    sys.argv = [sys.argv[0], "fit", *argv]
    __main__.__spec__ = importlib.util.find_spec("vit_lightning.cli")
    try:
        yield
    finally:
        sys.argv, __main__.__spec__ = saved


def _say(line: str) -> None:
    if rank_zero_only.rank == 0:
        print(line, flush=True)


def _quiet() -> None:
    """Silence advice that does not apply: in-memory data needs no workers; tiny test runs log rarely."""
    for pattern in (".*does not have many workers.*", ".*smaller than the logging interval.*",
                    ".*Experiment logs directory .* exists and is not empty.*",
                    ".*Checkpoint directory .* exists and is not empty.*", r".*isinstance\(treespec, LeafSpec\).*"):
        warnings.filterwarnings("ignore", message=pattern)
    # "Seed set to N" would otherwise stand before a bad option's one-line error; the record keeps the seed.
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """`vit-ablate fit [--config FILE] [--model.* --data.* --trainer.* --run.* --seed_everything]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet()
    try:
        cli = FitCLI(argv)
    except SystemExit as stop:  # --help, --print_config
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except (ArgumentError, ValueError, MisconfigurationException) as error:
        # Bad options stop here, before the run dir exists: nothing is written.
        print(f"vit-ablate fit: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return cli.fit_run(argv)


if __name__ == "__main__":
    sys.exit(main())
