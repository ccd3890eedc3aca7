"""fit's LightningCLI: its options (`--model.*`, `--data.*`, `--trainer.*`, `--run.*`), the parse and the trainer it
builds into the run directory."""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import torch
from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import LightningCLI
from typing_extensions import override

from vit_lightning.analysis import fewshot
from vit_lightning.analysis.evaluate import StartAccuracy
from vit_lightning.analysis.shuffle import PERMUTATIONS, ShuffledAccuracy
from vit_lightning.commands.fit.settings import _error, _quiet, _say, _warn, settings_error
from vit_lightning.compat.lightning import cli_options, set_collective_timeout
from vit_lightning.core.checks import check_choice, describe, non_finite
from vit_lightning.core.defaults import DEMO
from vit_lightning.core.identity import TRIAL_KEY, flatten, normalize, run_dir, world_size
from vit_lightning.core.names import LAST_CKPT, RECORD, RUN_DEFAULTS, SEED_KEY
from vit_lightning.data.datamodule import NAMED_AFTER_EARLIER, ImageDataModule
from vit_lightning.data.resumable import ResumeLoader
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES, added_after_earlier, family_options, trial_name
from vit_lightning.model.naming import EARLIER, FAMILY_DEFAULT_SINCE, FIRST, NAMING_KEY, VERSIONS
from vit_lightning.run import hyperband, loggers, machine, rundir, transfer
from vit_lightning.run.callbacks import (
    ConfigToLoggers,
    DivergenceStop,
    EpochPrinter,
    EpochSeed,
    StopSignal,
    stop_signal,
)
from vit_lightning.run.hyperband import HyperbandStop
from vit_lightning.run.module import Classifier
from vit_lightning.run.options import help_suffix
from vit_lightning.run.record import RunRecord, model_facts
from vit_lightning.run.rundir import RunDir, resume_point, use_atomic_checkpoints
from vit_lightning.run.slurm_tasks import task_error

# Every fit's trainer defaults; with no options `fit` trains the demo (defaults.DEMO). GPU users add
# --trainer.precision=bf16-mixed (and --trainer.deterministic=true for bitwise repeats); CPU kernels
# repeat exactly for a fixed seed already.
TRAINER_DEFAULTS = {"gradient_clip_val": 1.0, "log_every_n_steps": 10}
LINKED = ("num_classes", "in_chans", "img_size")  # data -> model, at instantiation
DDP_TIMEOUT_S = 600.0  # a rank that stops answering fails the run after this long (torch's own default: 30 min)
# errors of the disk, not of the run: reported in one line, and the same command resumes once they are fixed
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


class FitCLI(LightningCLI):
    """LightningCLI over Classifier + ImageDataModule with a `--run.*` group; builds the trainer into the run dir."""

    def __init__(self, argv: list[str], instantiate: bool = True):
        self.instantiate = instantiate  # False: parse and check the options only (fit_parser, check_trial)
        super().__init__(
            Classifier, ImageDataModule, args=argv, run=False, seed_everything_default=0,
            trainer_defaults=TRAINER_DEFAULTS, save_config_kwargs={"overwrite": True},
            # allow_abbrev=False: `--trainer.max_epoch` is an unknown option, not max_epochs (sweep keys are exact too)
            parser_kwargs={"exit_on_error": False, "prog": "vit-ablate fit", "allow_abbrev": False},
            auto_configure_optimizers=False, load_from_checkpoint_support=False,
        )

    @override
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run.root", type=str, default=RUN_DEFAULTS["run.root"],
                            help="Directory that holds all run records.")
        parser.add_argument("--run.ablation", type=str, default=RUN_DEFAULTS["run.ablation"],
                            help="Ablation this run belongs to.")
        parser.add_argument("--run.profile", type=str, default=RUN_DEFAULTS["run.profile"],
                            help="Profile (demo, cifar10, ...).")
        parser.add_argument("--run.trial", type=str | None, default=None,
                            help="Run directory name given by the sweep runner (default: from the config).")
        parser.add_argument(f"--{NAMING_KEY}", type=Literal[tuple(v for v in VERSIONS if v >= FIRST)], default=FIRST,
                            help="The naming rule version this run is named by (model/naming.py; 2 shows every "
                                 "swept key in words; runs named before keep 1).")
        parser.add_argument("--run.retrain", type=bool, default=False, help="Train again even if completed.")
        parser.add_argument("--run.wandb", type=Literal[loggers.MODES], default="auto",
                            help="auto: on with W&B credentials or under a W&B agent (offline there without them); "
                                 "else off.")
        parser.add_argument("--run.wandb_project", type=str | None, default=None, help="W&B project.")
        parser.add_argument("--run.fewshot_shots", type=list[int], default=list(fewshot.SHOTS),
                            help="k of the few-shot linear evaluation at the end of fit ([]: none).")
        parser.add_argument("--run.fewshot_every", type=int, default=0,
                            help="Also evaluate few-shot every N epochs (0: only at the end).")
        parser.add_argument("--run.shuffle_perms", type=int, default=PERMUTATIONS,
                            help="Permutations of each validation image's patches measured at the end of fit "
                                 "(val/acc_shuffled, val/shuffle_drop; 0: none).")
        parser.add_argument(f"--{hyperband.OPTION}", type=str | None, default=None,
                            help="A sweep's hyperband rule for this trial, as JSON {rule, metric, fixed} (the sweep "
                                 "writes it from its early_terminate): the trial stops at an epoch's end when it "
                                 "falls below its sweep's trials (the records in its folder with the fixed settings).")
        parser.add_argument("--run.ddp_timeout_s", type=float, default=DDP_TIMEOUT_S,
                            help="Seconds a DDP collective waits for a silent rank before the run fails.")
        for name, option in family_options().items():  # each family's own options, declared by the family
            parser.add_argument(f"--model.{name}", type=option.type, default=option.default, help=option.help)
        # The demo's settings, typed as if given on the command line (its warmup_epochs 1 is the float 1.0).
        demo = parser.parse_object(Namespace(DEMO))
        parser.set_defaults({key: demo[key] for key in DEMO})
        for key in LINKED:
            parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")
        for action, _ in cli_options(parser):  # --help names the values each option accepts
            action.help = f"{action.help or ''}{help_suffix(action.dest)}".strip() or action.help

    @override
    def parse_arguments(self, parser, args) -> None:
        self.config = parser.parse_args(args)  # no sys.argv cross-check: argv comes from the dispatcher
        if error := non_finite(self.config.as_dict()):  # before normalize, which reads NaN as null
            raise ValueError(error)
        check_choice("model.arch", self.config.model.get("arch") or DEFAULT_ARCH, FAMILIES)  # read below and in resolve
        # --model.init_from: the architecture comes from the source (a conflicting option is an error here)
        self.start = transfer.resolve(self.config, parser.get_defaults(), list(args))  # read once, here
        model = self.config.model
        if model.get("patch_size") is None:  # the demo's patch for this architecture (checked when the model is built)
            model.patch_size = FAMILIES[model.get("arch") or DEFAULT_ARCH].demo_patch

    @override
    def instantiate_classes(self) -> None:
        if self.instantiate:
            super().instantiate_classes()
            self.model.start = self.start  # the module loads the source fit resolved, not a second read

    @override
    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        """Trainer whose logs, checkpoint and record all live in the run dir (nothing is written until fit)."""
        config = self.flat_config()
        if error := settings_error(config) or task_error(config) or machine.problem(config):
            raise ValueError(error)  # before the run dir exists: nothing is written
        if self.start:
            self.start.check_data(config["model.in_chans"])
        if config.get(TRIAL_KEY) is None:  # under a W&B agent: named by its sweep parameters, as the local runner names it
            config[TRIAL_KEY] = self.trial_name(config)
        self.run_dir = directory = run_dir(config)
        self.flat = config
        facts = model_facts(self.model.model, config["model.in_chans"], config["model.img_size"])
        divergence, self.stop = DivergenceStop(), StopSignal()
        self.run_record = RunRecord(directory, config, facts, divergence)
        self.run_record.init_from = (self.start.account(config["model.patch_size"], config["model.img_size"])
                                     if self.start else None)
        # the sweep's hyperband rule (--run.early_terminate), judged after the record has this epoch
        self.run_record.early = HyperbandStop.from_option(config[hyperband.OPTION], directory,
                                                          lambda: self.run_record.history, config)
        tty = sys.stdout.isatty()
        trainer_config = self.config_init.get("trainer") or Namespace()
        trainer = super().instantiate_trainer(
            # default_root_dir: where Lightning's SLURM requeue checkpoint (hpc_ckpt_*.ckpt) goes and is resumed from
            **kwargs, callbacks=self.callbacks(config, trainer_config.get("callbacks"), divergence, tty),
            logger=[loggers.RunCSVLogger(directory)], enable_autolog_hparams=False, default_root_dir=str(directory),
            enable_progress_bar=tty and trainer_config.get("enable_progress_bar") is not False,
        )
        set_collective_timeout(trainer.strategy, config["run.ddp_timeout_s"])  # DDP (also chosen by "auto"), FSDP
        use_atomic_checkpoints(trainer.strategy)
        return trainer

    def flat_config(self) -> dict:
        """The run's flat options as its record and name hold them (the data's shape and the family's defaults in)."""
        # normalised once (`--trainer.devices=2` parses as "2", YAML `devices: 2` as 2): the name, record and loggers agree
        config = normalize(flatten({k: v for k, v in self.config.as_dict().items() if k != "config"}))
        config.update({f"model.{key}": getattr(self.datamodule, key) for key in LINKED})
        # options whose default depends on model.arch (None on the command line): the record and name hold the value built
        built = self.model.model.config
        config.update({f"model.{key}": getattr(built, key) for key in FAMILIES[built.arch].defaults})
        return config

    def trial_name(self, config: dict) -> str:
        """An ad hoc run's name, or a W&B agent's trial's from its sweep parameters; sets the earlier rule's name too."""
        built = self.model.model.config
        world = world_size(config, torch.cuda.device_count())
        # ad hoc: a source by its canonical id, so every spelling of its path names one run
        own = {**config, "model.init_from": self.start.source.id} if self.start else config
        if params := loggers.sweep_params():
            return trial_name(transfer.named_by_source(params), world)
        # ad hoc: only values away from the parser's defaults are hashed, so new options rename nothing
        defaults = flatten({k: v for k, v in self.parser.get_defaults().as_dict().items() if k != "config"})
        family = {f"model.{k}": v for k, v in FAMILIES[built.arch].defaults.items()}
        defaults.update({k: family[k] for k in FAMILY_DEFAULT_SINCE})
        # the earlier rule (every value hashed), over the options that version had (model/ and data/ say which)
        later = added_after_earlier() | set(NAMED_AFTER_EARLIER)
        earlier = {k: v for k, v in own.items() if k not in later}
        earlier.update({k: then for k, then in FAMILY_DEFAULT_SINCE.items() if own[k] == family[k]})
        self.earlier_name = trial_name(earlier, world, version=EARLIER)
        return trial_name(own, world, defaults)

    def callbacks(self, config: dict, given, divergence: DivergenceStop, tty: bool) -> list[pl.Callback]:
        """fit's callbacks after those given, in the order they must run at an epoch's and the fit's end."""
        shots = config["run.fewshot_shots"]
        return [
            *(given if isinstance(given, list) else [given] if given else []),
            # One checkpoint, overwritten every epoch: {run dir}/last.ckpt (resume point, final weights).
            ModelCheckpoint(dirpath=self.run_dir, filename=Path(LAST_CKPT).stem, save_top_k=1,
                            save_on_train_epoch_end=True, enable_version_counter=False),
            *([StartAccuracy(self.start.source)] if self.start else []),  # before any fine-tuning step
            *([fewshot.FewShotEval(shots, config["run.fewshot_every"])] if shots else []),  # before the record
            *([ShuffledAccuracy(perms)] if (perms := config["run.shuffle_perms"]) else []),
            divergence,
            self.stop,
            self.run_record,
            *([self.run_record.early] if self.run_record.early else []),
            loggers.WandbSummary(self.run_record),  # after the record: mirrors what it has just written
            ConfigToLoggers(config),
            EpochSeed(config.get(SEED_KEY)),
            ResumeLoader(),  # a mid-epoch resume goes on where its epoch stopped (data/resumable.py)
            RichProgressBar() if tty else EpochPrinter(),
        ]

    def fit_run(self) -> int:
        """Train the run dir as its only writer (rank 0 holds its lock for the whole fit); the exit code."""
        earlier = self.run_dir.parent / getattr(self, "earlier_name", self.run_dir.name)
        if earlier != self.run_dir and earlier.is_dir() and not self.run_dir.exists():
            _warn(f"vit-ablate fit: note: an earlier version named this run {earlier.name}; it is now "
                  f"{self.run_dir.name} (rename {earlier} to that to resume it or keep its record)")
        try:
            run = RunDir.open(self.run_dir, self.config["run.retrain"], owner=rank_zero_only.rank == 0)
        except rundir.Busy as busy:
            return _error(f"{busy}; not started: a run dir has one writer at a time", rundir.BUSY)
        except OSError as error:
            return _error(f"cannot write the run dir: {describe(error)}", 1)
        with run:
            code = self._fit_in(run)
        self.stop.requeue()  # after SLURM's requeue signal, once the run is written and its lock free
        return code

    def _fit_in(self, run: RunDir) -> int:
        """Skip a finished run, resume an unfinished one from its newest checkpoint, or start it."""
        if run.finished and not self.config["run.retrain"]:
            _say(f"vit-ablate fit: skipped, run already {run.previous['status']}; record: {run.path / RECORD}")
            if changed := self.start and self.start.changed_since(run.previous):
                _warn(f"vit-ablate fit: {changed}; --run.retrain=true trains it again from the source as it is now")
            if rank_zero_only.rank == 0:  # under a W&B agent its run gets the finished record
                loggers.report_finished(run.path, self.flat, run.previous)
            return 0
        self.run_record.previous, self.run_record.recovery = run.previous, run.recovery
        if run.recovery:
            _warn(f"vit-ablate fit: {run.recovery}")
        # W&B attached only now: whether it resumes a run depends on the record read under the lock
        if wandb_logger := loggers.logger(run.path, self.flat, run.previous):
            self.trainer.loggers = [*self.trainer.loggers, wandb_logger]
        ckpt_path = str(run.resume) if run.resume else None
        _say(f"vit-ablate fit: {'resuming from ' + ckpt_path if ckpt_path else 'run dir ' + str(run.path)}")
        try:
            self.trainer.fit(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
        except BaseException as error:
            if signum := self.stop.signum or stop_signal(error):
                return self.interrupted(signum)
            if isinstance(error, OSError) and error.errno in DISK_ERRORS:
                where = "" if error.filename else f" (in {run.path})"
                return _error(f"{describe(error)}{where}; fix that and run the same command again to resume", 1)
            raise
        finally:
            loggers.finish_wandb(self.trainer)
        return 0

    def interrupted(self, signum: int) -> int:
        """Fit was stopped by SIGTERM/SIGINT (pre-emption, Ctrl-C, the sweep): its record says interrupted; 128+signal."""
        newest = resume_point(self.run_dir)
        then = f"the same command resumes from {newest}" if newest else "the same command starts it again"
        _warn(f"vit-ablate fit: stopped by {signal.Signals(signum).name}; {then}")
        return 128 + signum

    def starts_other_ranks(self) -> bool:
        """Lightning itself will start this fit's other processes (not torchrun, SLURM, ...)."""
        environment = getattr(self.trainer.strategy, "cluster_environment", None)
        return self.trainer.world_size > 1 and environment is not None and not environment.creates_processes_externally


def fit_parser():
    """The `vit-ablate fit` parser (every option, its type and default), built without instantiating anything."""
    _quiet()  # its "Seed set to 0" would stand before a sweep's one-line answer
    return FitCLI([], instantiate=False).parser


def fit_options() -> set[str]:
    """Every dotted option `vit-ablate fit` accepts."""
    return {key for key in fit_parser().get_defaults().keys() if key != "config"}
