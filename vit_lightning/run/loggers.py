"""The loggers of `vit-ablate fit`: its CSV log, and the W&B side (whether it logs, its WandbLogger, what each run
tells W&B, closing the run). Every wandb call of fit goes through here.

Lightning's WandbLogger creates the run on rank 0 only. `WandbSummary` mirrors the run record into
that run (the sweep metric every epoch and in the summary, the compute facts, the status), so W&B's
sweep view and `vit-ablate table --wandb` see what results.json holds. Under a `wandb agent`, a trial
stopped by SIGTERM or SIGINT marks its run preempting, so W&B requeues it; the requeued trial gets
the same W&B run id and resumes it from the trial's last.ckpt, continuing the same W&B history.
"""

from __future__ import annotations

import contextlib
import csv
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from vit_lightning.compat.wandb import credentials as wandb_credentials
from vit_lightning.compat.wandb import env_mode
from vit_lightning.core.checks import one_line
from vit_lightning.core.names import BEST_METRIC, FINAL, SUMMARY_FIELDS
from vit_lightning.run.record import RunRecord
from vit_lightning.run.rundir import load_record

MODES = ("auto", "online", "offline", "off")
STEP_KEY = "trainer/global_step"  # the step Lightning's WandbLogger adds to each history row


def under_agent() -> bool:
    """This process runs a trial a `wandb agent` started (the agent sets WANDB_SWEEP_ID)."""
    return bool(os.environ.get("WANDB_SWEEP_ID"))


def mode(choice: str) -> str | None:
    """auto: on under a W&B agent or with credentials; offline when there are no credentials; None = off."""
    if choice in ("online", "offline"):
        return choice
    if choice == "off" or env_mode() == "disabled":
        return None
    credentials = wandb_credentials()
    if not (under_agent() or credentials):
        return None
    return "online" if credentials and env_mode() != "offline" else "offline"


def sweep_params() -> dict[str, Any] | None:
    """The parameters a W&B agent handed this trial (its WANDB_SWEEP_PARAM_PATH file); None outside an agent."""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH")
    if not (under_agent() and path):
        return None
    try:
        data = yaml.safe_load(Path(path).read_text())  # {wandb_version: 1, key: {value: v}, ...}
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: v["value"] for k, v in data.items() if isinstance(v, dict) and "value" in v}


def logger(directory: Path, config: dict, previous: dict | None = None) -> WandbLogger | None:
    """Lightning's WandbLogger for this run (it creates the W&B run on rank 0 only), or None when W&B is off.

    An interrupted run continues its W&B run: outside an agent by the id its record holds; under an agent
    the agent names the run, and a requeued trial gets its old id back. previous: the record as fit found it
    once it held the run dir (read here when not given).
    """
    chosen = mode(config["run.wandb"])
    if not chosen:
        return None
    _Service.gone = False  # a new run: wandb.init starts a service if an earlier fit of this process lost its one
    previous = (load_record(directory)[0] if previous is None else previous) or {}
    before = previous.get("wandb") or {}
    unfinished = bool(before.get("run_id")) and previous.get("status") not in FINAL and not config["run.retrain"]
    # WandbLogger has wandb.init resume the run of its id ("allow"): under an agent the agent's id (WANDB_RUN_ID,
    # which a requeued trial gets back), otherwise the id, project and entity the interrupted attempt recorded
    extra = resumed(before) if unfinished and not under_agent() else {}
    # mode goes to wandb.init itself: wandb reads its environment once per process (the credentials check above)
    options = {"name": directory.name, "save_dir": str(directory), **_grouping(config, extra.pop("project", None)),
               **extra}
    wandb_logger = GuardedWandbLogger(mode=chosen, **options)
    if chosen != "online" or under_agent():  # an agent's run exists on the server already (the agent created it)
        return wandb_logger
    try:  # a compute node without internet is common: find out now, once, instead of inside fit
        wandb_logger.experiment  # noqa: B018  (wandb.init on rank 0; a stand-in on the other ranks)
    except Exception as error:
        print(f"vit-ablate fit: W&B is unreachable ({one_line(error)[:200]}); this run logs to W&B offline in "
              f"{directory / 'wandb'} (`wandb sync` uploads it later)", file=sys.stderr, flush=True)
        finish(1)
        return GuardedWandbLogger(mode="offline", **options)
    return wandb_logger


def _grouping(config: dict, project: str | None = None) -> dict:
    """The W&B project, group and tags of a run (`project`: the one an interrupted attempt recorded, if any)."""
    project = project or config["run.wandb_project"] or os.environ.get("WANDB_PROJECT", "vit-lightning")
    return {"project": project, "group": config["run.ablation"], "tags": [config["run.ablation"], config["run.profile"]]}


def report_finished(directory: Path, config: dict, record: dict) -> None:
    """Under a W&B agent, a trial whose run dir had already finished gives the agent's run that record (summary
    and the sweep metric), so the sweep sees the result instead of a run that never started; else nothing."""
    chosen = mode(config["run.wandb"])
    if not (under_agent() and chosen):
        return
    import wandb

    run = guarded(wandb.init, name=directory.name, dir=str(directory), mode=chosen, **_grouping(config))
    if run is None:
        return
    best = (record.get("metrics") or {}).get(BEST_METRIC)
    if best is not None:
        guarded(run.log, {BEST_METRIC: best})
    guarded(run.summary.update, {**summary(record), "skipped": "run dir already finished"})
    finish(0)


class _Service:
    gone = False  # wandb's service process stopped answering (SLURM signals every process of a job)


def guarded(call, *args, **kwargs):
    """A W&B call that must not cost the run: once wandb's service is gone, one line, and later calls are skipped.

    scancel, pre-emption and time limits signal every process of a job, wandb-core (which exits on SIGTERM
    and SIGINT) among them, often before the trial has stopped; the record and the exit code must survive.
    """
    if _Service.gone:
        return None
    try:
        return call(*args, **kwargs)
    except Exception as error:
        if not isinstance(error, OSError) and not type(error).__module__.startswith("wandb"):
            raise  # a bug of ours, not a lost connection
        _Service.gone = True
        print(f"vit-ablate fit: W&B's service process is gone ({one_line(error)}); the run goes on, and its W&B "
              "run gets this attempt from a new service when it ends", file=sys.stderr, flush=True)
        return None


class GuardedWandbLogger(WandbLogger):
    """Lightning's WandbLogger whose W&B run outlives wandb's service process (see `guarded`).

    It keeps what it sent this attempt (history rows, config, summary, preempting): wandb-core buffers its
    run file in memory, so one killed by SIGTERM leaves none of it on disk or on a server. When the service
    is gone at the end, `close` resumes the same run id in a new service and sends it what the dead one lost,
    then the exit record: the run says preempting, not crashed, and W&B requeues it.

    Under a W&B agent the sweep's own keys are already in the run's config, locked by the sweep: they
    are not logged again (wandb would warn once per key that the update is ignored).
    """

    def __init__(self, **options):
        super().__init__(**options)
        self.options = options
        self.rows: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.last_summary: dict[str, Any] = {}
        self.preempting = False

    @override
    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append(dict(metrics, **({STEP_KEY: step} if step is not None else {})))  # as Lightning logs it
        guarded(super().log_metrics, metrics, step)

    @override
    def log_hyperparams(self, params) -> None:
        swept = sweep_params() or {}
        params = {k: v for k, v in dict(params).items() if k not in swept}
        self.config.update(params)
        guarded(super().log_hyperparams, params)

    def update_summary(self, values: dict[str, Any]) -> None:
        self.last_summary.update(values)
        guarded(self.experiment.summary.update, values)

    def mark_preempting(self) -> None:
        self.preempting = True
        guarded(self.experiment.mark_preempting)

    def close(self, exit_code: int) -> None:
        """End the W&B run; with the service gone, first resend this attempt to the same run in a new service."""
        if _Service.gone:
            self._resend(exit_code)
        finish(exit_code)

    def _resend(self, exit_code: int) -> None:
        import wandb

        dead = self.experiment  # its id, project and entity are local facts, the service is not asked
        with contextlib.suppress(Exception):
            wandb.teardown()  # drops the dead connection (and wandb's atexit teardown)
        _Service.gone = False
        init = {"name": self.options.get("name"), "dir": self.options.get("save_dir"), "mode": self.options["mode"],
                "project": dead.project, "entity": dead.entity or None, "id": dead.id,
                "group": self.options.get("group"), "tags": self.options.get("tags")}
        # SLURM sends SIGKILL KillWait (default 30 s) after SIGTERM: a short init, the run record is written already
        run = guarded(wandb.init, **init, resume="allow", settings=wandb.Settings(init_timeout=20))
        if run is None:
            return
        known = guarded(run.summary.get, STEP_KEY)  # how far a server's copy of the run goes (offline: nowhere)
        guarded(run.config.update, self.config, allow_val_change=True)
        for row in self.rows:
            if known is None or row.get(STEP_KEY, known + 1) > known:
                guarded(run.log, row)
        guarded(run.summary.update, self.last_summary)
        if self.preempting:
            guarded(run.mark_preempting)
        print(f"vit-ablate fit: W&B run {dead.id} resumed in a new service process and given this attempt's "
              f"{len(self.rows)} history rows", file=sys.stderr, flush=True)


def finish(exit_code: int) -> None:
    """End this process's W&B run; with wandb's service gone, drop the connection without wandb's atexit traceback."""
    import wandb

    if wandb.run is None:
        return
    guarded(wandb.finish, exit_code=exit_code)
    if _Service.gone:
        with contextlib.suppress(Exception):
            wandb.teardown()  # unregisters wandb's atexit teardown first, then fails to reach the service


def resumed(before: dict) -> dict[str, str]:
    """wandb.init's id, project and entity of the W&B run an interrupted attempt recorded (those it has)."""
    return {key: before[name] for key, name in (("id", "run_id"), ("project", "project"), ("entity", "entity"))
            if before.get(name)}


def summary(record: dict) -> dict[str, Any]:
    """What the W&B summary holds of a run record: its metrics, compute/* facts, status, trial id and times."""
    out: dict[str, Any] = {k: v for k, v in (record.get("metrics") or {}).items() if v is not None}
    out.update({f"compute/{k}": v for k, v in (record.get("compute") or {}).items() if v is not None})
    out.update({k: record[k] for k in SUMMARY_FIELDS if record.get(k)})
    return out


class WandbSummary(pl.Callback):
    """Mirrors the run record into the W&B run (rank 0); marks it preempting when a signal stopped the run.

    Placed after the RunRecord callback, so each hook sees the record that callback has just written.
    """

    def __init__(self, record: RunRecord):
        self.record = record

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mirror(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        best = (self.record.record.get("metrics") or {}).get(BEST_METRIC)
        for wandb_logger in _wandb_loggers(trainer):
            if best is not None:  # the sweep metric in the history, for W&B's sweep charts; with its epoch, as
                # Lightning's own rows carry it, so `table --wandb` files the row under that epoch
                wandb_logger.log_metrics({BEST_METRIC: best, "epoch": trainer.current_epoch}, step=trainer.global_step)
        self._mirror(trainer)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mirror(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        for wandb_logger in _wandb_loggers(trainer):
            if isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
                # stopped, not broken: W&B requeues a preempting sweep run that exits non-zero
                wandb_logger.mark_preempting()
        self._mirror(trainer)

    def _mirror(self, trainer: pl.Trainer) -> None:
        for wandb_logger in _wandb_loggers(trainer):
            wandb_logger.update_summary(summary(self.record.record))


def _wandb_loggers(trainer: pl.Trainer) -> list[GuardedWandbLogger]:
    """The trainer's W&B loggers on rank 0 (the other ranks have no W&B run)."""
    if not trainer.is_global_zero:
        return []
    return [logger_ for logger_ in trainer.loggers if isinstance(logger_, GuardedWandbLogger)]


class RunCSVLogger(Logger):
    """metrics.csv and hparams.yaml straight in the run dir, Lightning's CSV layout; a resumed run continues them."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = Path(directory)
        self.rows: list[dict[str, Any]] = []

    @override
    @property
    def name(self) -> str:
        return ""

    @override
    @property
    def version(self) -> str:
        return ""

    @override
    @property
    def save_dir(self) -> str:
        return str(self.directory)  # the trainer's log_dir: config.yaml lands here too

    @override
    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        save_hparams_to_yaml(self.directory / "hparams.yaml", dict(params))

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append({**metrics, "step": step})

    @override
    @rank_zero_only
    def save(self) -> None:
        """Append the new rows; when they bring new columns, rewrite the file under the sorted union of columns."""
        if not self.rows:
            return
        path = self.directory / "metrics.csv"
        old: list[dict] = []
        header: list[str] = []
        if path.is_file():
            with path.open(newline="") as file:
                header = next(csv.reader(file), [])
        keys = sorted(set(header).union(*self.rows))
        if header and keys != header:
            with path.open(newline="") as file:
                old = list(csv.DictReader(file))
        self.directory.mkdir(parents=True, exist_ok=True)
        with path.open("a" if header and keys == header else "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=keys)
            if not (header and keys == header):
                writer.writeheader()
            writer.writerows([*old, *self.rows])
        self.rows = []


def finish_wandb(trainer: pl.Trainer) -> None:
    """Close the W&B run Lightning opened on rank 0, so a later fit in this process starts its own."""
    for wandb_logger in _wandb_loggers(trainer):
        wandb_logger.close(exit_code=1 if trainer.state.status.value == "interrupted" else 0)
