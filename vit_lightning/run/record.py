"""The run record: results.json in the run's directory (see identity.run_dir), written by rank 0."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import WandbLogger
from typing_extensions import override

from vit_lightning.ablation import source_checkout
from vit_lightning.compat.torch import compile_seconds
from vit_lightning.core.checks import one_line
from vit_lightning.core.files import now
from vit_lightning.core.identity import number, plain
from vit_lightning.core.names import BEST_METRIC, COMMIT_CHANGED
from vit_lightning.model.naming import FIRST, NAMING_KEY
from vit_lightning.run.callbacks import DivergenceStop, EpochClock, stop_signal
from vit_lightning.run.rundir import load_record, write_record

SCHEMA = 1
HISTORY_KEYS = ("val/acc", "val/acc5", "val/loss", "train/loss", "train/acc")


def versions() -> dict[str, str]:
    """The versions that trained the run, and the commit of the source checkout it ran from (source_commit)."""
    import lightning
    import torchmetrics

    import vit_lightning

    return {"python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
            "torchmetrics": torchmetrics.__version__, "vit_lightning": vit_lightning.__version__, **source_commit()}


CODE = ("vit_lightning", "ablations")  # what shapes a run: edits elsewhere (results, docs) leave its commit exact


def source_commit() -> dict[str, str]:
    """{"commit": HEAD's hash (COMMIT_CHANGED after it where the code differs)} of the git checkout this package
    runs from; {} for an installed package, or where git cannot tell."""
    root = source_checkout()
    if root is None:
        return {}
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        status = subprocess.run([*git, "status", "--porcelain", "--", *CODE], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git here, or it hangs
        return {}
    if head.returncode or status.returncode:
        return {}
    return {"commit": head.stdout.strip() + (COMMIT_CHANGED if status.stdout.strip() else "")}


@torch.no_grad()
def gflops_per_image(model: torch.nn.Module, in_chans: int, img_size) -> float:
    """Forward GFLOPs for one image, counting a multiply-add as ONE FLOP (the GFLOPs of ViT/DeiT tables)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    hw = tuple(img_size) if isinstance(img_size, (list, tuple)) else (img_size, img_size)
    param = next(model.parameters())
    x = torch.zeros(1, in_chans, *hw, device=param.device, dtype=param.dtype)
    was_training = model.training
    model.eval()
    try:
        # The math attention kernel is made of matmuls the counter sees (the fused CPU kernel is not counted).
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 2 / 1e9  # FlopCounterMode counts 2 FLOPs per multiply-add


def model_facts(model: torch.nn.Module, in_chans: int, img_size) -> dict[str, Any]:
    """The facts a record keeps about a model: parameter count, forward GFLOPs per image, and those its family
    gives about its position encoding as built (`position_facts`, where it has one)."""
    position = getattr(model, "position_facts", None)
    return {"params": sum(p.numel() for p in model.parameters()),
            "gflops_per_image": gflops_per_image(model, in_chans, img_size), **(position() if position else {})}


class RunRecord(EpochClock):
    """Keeps results.json up to date on rank 0; its history travels in last.ckpt so a resumed run continues it.

    `facts` are the model's compute facts (params, GFLOPs); `divergence` says whether the run ended diverged.
    """

    init_from: dict | None = None  # the source of a run started from a trained model (transfer.Source.account)
    early = None  # hyperband.HyperbandStop of a sweep trial whose sweep has early_terminate; its `reason` ends it

    def __init__(self, directory: Path, config: dict[str, Any], facts: dict[str, Any], divergence: DivergenceStop):
        self.directory, self.config, self.facts, self.divergence = Path(directory), config, facts, divergence
        self.history: list[dict] = []
        self.previous: dict | None = None  # the record fit read once it held the run dir (None: read it here)
        self.seconds = {"wall": 0.0, "train": 0.0, "compile": 0.0}  # totals over attempts, up to the last checkpoint
        self.train_images = 0
        self.record: dict = {}
        self.extra_metrics: dict[str, float] = {}  # computed outside the epoch loop (few-shot accuracies)
        self.recovery: str | None = None  # set by fit when it had to drop a corrupt record or checkpoint
        self._start = self._tick = self._compile_start = 0.0
        self._validated = False
        self._epoch = [0, 0.0]  # this epoch's (train images, train seconds)
        self._steady = [0, 0.0]  # the same over the epochs after the first this process trained (no warm-up, compile)
        self._epochs_here = 0

    # --- state carried in the checkpoint -------------------------------------------------------------
    @override
    def state_dict(self) -> dict:
        return {"history": self.history, "seconds": self._totals(), "train_images": self.train_images}

    @override
    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        self.seconds = {"compile": 0.0, **state["seconds"]}  # a checkpoint from before compile time was kept
        self.train_images = int(state["train_images"])

    def add_metrics(self, values: dict[str, float]) -> None:
        """Metrics another callback computed (few-shot evaluation); they stay in `metrics` from the next write on."""
        self.extra_metrics.update(values)

    # --- hooks ----------------------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._start = time.perf_counter()
        self._compile_start = compile_seconds()  # torch.compile's time is counted per process

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.record = self._new_record(trainer)
            self._write()

    @override
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._validated = False
        self._epoch = [0, 0.0]

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now_ = time.perf_counter()
        took, images = now_ - self._tick, batch[0].shape[0] * trainer.world_size
        self.seconds["train"] += took
        self._tick = now_
        self.train_images += images
        self._epoch = [self._epoch[0] + images, self._epoch[1] + took]

    @override
    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._validated = not trainer.sanity_checking

    @override
    def on_validation_end(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()  # validation time is not training time

    @override
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._epochs_here += 1
        if self._epochs_here > 1:
            self._steady = [self._steady[0] + self._epoch[0], self._steady[1] + self._epoch[1]]
        if not self._validated:
            return
        metrics = {k: plain(number(trainer.callback_metrics.get(k))) for k in HISTORY_KEYS}  # non-finite: None
        self.history.append({"epoch": trainer.current_epoch, "step": trainer.global_step, **metrics})
        if trainer.is_global_zero:
            self._update(trainer)
            self._write()

    @override
    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            reason = getattr(self.early, "reason", None)
            if reason and not self.divergence.diverged:
                self.record["stopped_early"] = reason
            self._finish(trainer, "diverged" if self.divergence.diverged else "stopped_early" if reason else "completed")

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not trainer.is_global_zero:
            return
        signum = stop_signal(exception)
        self.record = self.record or self._new_record(trainer)  # stopped before training started
        self.record["error"] = f"stopped by {signal.Signals(signum).name}" if signum else one_line(exception)
        try:
            self._finish(trainer, "interrupted" if signum else "failed")
        except OSError:
            pass  # the disk is full or gone: the error that brought us here is what fit reports

    # --- helpers -------------------------------------------------------------------------------------
    def _new_record(self, trainer: pl.Trainer) -> dict:
        previous = (load_record(self.directory)[0] if self.previous is None else self.previous) or {}
        cfg = self.config
        return {
            "schema": SCHEMA, "name": self.directory.name, "trial": self.directory.name,  # the sweep's lookup key
            "naming": cfg.get(NAMING_KEY, FIRST),  # the naming rule version that named it (model/naming.py)
            "ablation": cfg["run.ablation"], "profile": cfg["run.profile"],
            "status": "running", "config": cfg, "metrics": {}, "history": self.history,
            "compute": {
                **self.facts, "device": trainer.strategy.root_device.type, "num_devices": trainer.world_size,
                "precision": str(trainer.precision), **loader_facts(trainer.datamodule),
            },
            "versions": versions(), "wandb": _wandb_info(trainer), "error": None, "recovery": self.recovery,
            "started_at": (previous.get("started_at") if self.history else None) or now(), "finished_at": None,
            **({"init_from": self.init_from} if self.init_from else {}),  # where the weights came from
        }

    def _totals(self) -> dict[str, float]:
        return {"wall": self.seconds["wall"] + time.perf_counter() - self._start, "train": self.seconds["train"],
                "compile": self.seconds["compile"] + compile_seconds() - self._compile_start}

    def _update(self, trainer: pl.Trainer) -> None:
        rec, last = self.record, (self.history[-1] if self.history else {})
        accs = [h["val/acc"] for h in self.history if h.get("val/acc") is not None]
        rec["metrics"] = {**{k: last.get(k) for k in HISTORY_KEYS}, BEST_METRIC: max(accs) if accs else None,
                          "epochs": len(self.history), "steps": trainer.global_step, **self.extra_metrics}
        totals = self._totals()
        rec["compute"]["wall_s"] = round(totals["wall"], 2)
        rec["compute"]["train_images_per_s"] = rate(self.train_images, totals["train"])
        if hasattr(trainer.datamodule, "distinct_train_images"):  # how many of the images trained were different
            rec["compute"]["distinct_train_images"] = trainer.datamodule.distinct_train_images(self.train_images)
        if self.config.get("model.compile"):  # inside the first steps' time: what compiling cost this run
            rec["compute"]["compile_s"] = round(totals["compile"], 1)
        # the last epoch's rate (what a sweep adds up over its running trials), and the rate after this process's
        # first epoch: the steady state, without the warm-up, the loader's start and compilation
        rec["compute"]["epoch_images_per_s"] = rate(*self._epoch)
        rec["compute"]["steady_images_per_s"] = rate(*self._steady)

    def _finish(self, trainer: pl.Trainer, status: str) -> None:
        self._update(trainer)
        self.record.update(status=status, finished_at=now())
        self._write()

    def _write(self) -> None:
        write_record(self.directory, self.record)


def loader_facts(data) -> dict[str, Any]:
    """The loader workers a run used (data.num_workers, at most its sweep slot's share), where it augmented and where
    it decoded its images."""
    if data is None or not hasattr(data, "workers"):
        return {}
    return {"loader_workers": data.workers, "augment_on": "device" if data.augments_on_device() else "cpu",
            "decode_on": "device" if data.decodes_on_device() else "cpu"}


def rate(images: int, seconds: float) -> float | None:
    """Images per second, to 0.1; None without any time."""
    return round(images / seconds, 1) if seconds > 0 else None


def _wandb_info(trainer: pl.Trainer) -> dict | None:
    """Run/sweep ids of the W&B run Lightning's WandbLogger created on rank 0, if any."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            sweep = getattr(run, "sweep_id", None) or os.environ.get("WANDB_SWEEP_ID")
            return {"run_id": getattr(run, "id", None), "sweep_id": sweep, "project": getattr(run, "project", None),
                    "entity": getattr(run, "entity", None)}
    return None
