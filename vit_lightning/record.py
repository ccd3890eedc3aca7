"""The run record: one directory per run named from its config, holding results.json (rank 0 writes it)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import WandbLogger

from vit_lightning.bookkeeping import now, write_atomic

SCHEMA = 1
RECORD = "results.json"
# Keys that do not change what is trained: bookkeeping (already in the path), display switches, and
# compilation (the same model, computed faster: a run may resume with it toggled).
NOT_IDENTITY = ("run.", "trainer.enable_progress_bar", "trainer.enable_model_summary", "model.compile")
HISTORY_KEYS = ("val/acc", "val/acc5", "val/loss", "train/loss", "train/acc")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat dotted keys with plain JSON values (tuples become lists, paths strings).

    A class given as {class_path, init_args} (a callback, a logger) stays one value.
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and "class_path" not in value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = _plain(value)
    return flat


def canonical(config: dict[str, Any]) -> dict[str, Any]:
    """Spellings Lightning treats alike, made equal (`--trainer.devices=2` parses as "2", YAML `devices: 2` as 2)."""
    devices = config.get("trainer.devices")
    if isinstance(devices, str) and devices.isdigit():
        config["trainer.devices"] = int(devices)
    return config


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN/inf
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def run_name(config: dict[str, Any]) -> str:
    """Readable summary of the ablation axes plus a hash of everything that changes training."""
    identity = {k: v for k, v in config.items() if not k.startswith(NOT_IDENTITY)}
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    get = config.get
    parts = [get("data.name"), get("model.variant"), f"p{get('model.patch_size')}", get("model.pos_encoding"),
             get("model.pos_injection"), get("model.pooling")]
    if get("model.stem") == "hybrid":
        parts[2] = "hybrid" + "-".join(map(str, get("model.hybrid_layers") or []))
    parts += [f"lr{get('model.lr'):g}" if isinstance(get("model.lr"), float) else None,
              f"s{get('seed_everything')}", digest]
    name = "-".join(str(p) for p in parts if p is not None)
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def run_dir(config: dict[str, Any]) -> Path:
    """{run.root}/{run.ablation}/{run.profile}/{run_name}: the same config always gives the same directory."""
    return Path(config["run.root"]) / config["run.ablation"] / config["run.profile"] / run_name(config)


def read_record(directory: Path) -> dict | None:
    path = Path(directory) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def write_record(directory: Path, record: dict) -> None:
    """Atomic write: readers never see a half-written results.json."""
    write_atomic(directory / RECORD, (json.dumps(_plain(record), indent=2, allow_nan=False) + "\n").encode())


def versions() -> dict[str, str]:
    import lightning
    import torchmetrics

    import vit_lightning

    return {"python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
            "torchmetrics": torchmetrics.__version__, "vit_lightning": vit_lightning.__version__}


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


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class RunRecord(pl.Callback):
    """Keeps results.json up to date on rank 0; its history travels in last.ckpt so a resumed run continues it."""

    def __init__(self, directory: Path, config: dict[str, Any]):
        self.directory, self.config = Path(directory), config
        self.history: list[dict] = []
        self.seconds = {"wall": 0.0, "train": 0.0}  # totals over attempts, up to the last checkpoint
        self.train_images = 0
        self.diverged = False
        self.record: dict = {}
        self._start = self._tick = 0.0
        self._validated = False
        self._bad = None  # device flag: a non-finite loss since the last check

    # --- state carried in the checkpoint -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"history": self.history, "seconds": self._totals(), "train_images": self.train_images}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        self.seconds = dict(state["seconds"])
        self.train_images = int(state["train_images"])

    # --- hooks ----------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._start = time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        cfg = self.config
        self.record = self._new_record(trainer, pl_module)
        self.record["compute"]["gflops_per_image"] = gflops_per_image(
            pl_module.model, cfg["model.in_chans"], cfg["model.img_size"]
        )
        self._write()
        for logger in trainer.loggers:  # hparams.yaml and the W&B run config get the sweep's flat keys
            logger.log_hyperparams(cfg)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()
        self._validated = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now_ = time.perf_counter()
        self.seconds["train"] += now_ - self._tick
        self._tick = now_
        self.train_images += batch[0].shape[0] * trainer.world_size
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = ~torch.isfinite(loss.detach())
        self._bad = bad if self._bad is None else self._bad | bad
        if (trainer.global_step % max(1, trainer.log_every_n_steps) == 0) or trainer.is_last_batch:
            self._check_divergence(trainer)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._validated = not trainer.sanity_checking

    def on_validation_end(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()  # validation time is not training time

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._check_divergence(trainer)
        if not self._validated:
            return
        metrics = {k: _number(trainer.callback_metrics.get(k)) for k in HISTORY_KEYS}
        self.history.append({"epoch": trainer.current_epoch, "step": trainer.global_step, **metrics})
        if trainer.is_global_zero:
            self._update(trainer)
            self._write()

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self._finish(trainer, "diverged" if self.diverged else "completed")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.record = self.record or self._new_record(trainer, pl_module)  # failed before training started
            self.record["error"] = one_line(exception)
            self._finish(trainer, "failed")

    # --- helpers -------------------------------------------------------------------------------------
    def _new_record(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        previous = read_record(self.directory) or {}
        cfg = self.config
        return {
            "schema": SCHEMA, "name": self.directory.name,
            "ablation": cfg["run.ablation"], "profile": cfg["run.profile"],
            "status": "running", "config": cfg, "metrics": {}, "history": self.history,
            "compute": {
                "params": sum(p.numel() for p in pl_module.model.parameters()), "gflops_per_image": None,
                "device": trainer.strategy.root_device.type, "num_devices": trainer.world_size,
                "precision": str(trainer.precision),
            },
            "versions": versions(), "wandb": _wandb_info(trainer), "error": None,
            "started_at": (previous.get("started_at") if self.history else None) or now(), "finished_at": None,
        }

    def _check_divergence(self, trainer: pl.Trainer) -> None:
        """Stop every rank together once any rank saw a non-finite loss."""
        bad = bool(self._bad.item()) if self._bad is not None else False
        self._bad = None
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad and not self.diverged:
            self.diverged = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"non-finite loss at step {trainer.global_step}: stopping; the run is recorded as diverged",
                      flush=True)

    def _totals(self) -> dict[str, float]:
        return {"wall": self.seconds["wall"] + time.perf_counter() - self._start, "train": self.seconds["train"]}

    def _update(self, trainer: pl.Trainer) -> None:
        rec, last = self.record, (self.history[-1] if self.history else {})
        accs = [h["val/acc"] for h in self.history if h.get("val/acc") is not None]
        rec["metrics"] = {**{k: last.get(k) for k in HISTORY_KEYS}, "val/acc_best": max(accs) if accs else None,
                          "epochs": len(self.history), "steps": trainer.global_step}
        totals = self._totals()
        rec["compute"]["wall_s"] = round(totals["wall"], 2)
        rec["compute"]["train_images_per_s"] = (
            round(self.train_images / totals["train"], 1) if totals["train"] > 0 else None
        )

    def _finish(self, trainer: pl.Trainer, status: str) -> None:
        self._update(trainer)
        self.record.update(status=status, finished_at=now())
        self._write()

    def _write(self) -> None:
        write_record(self.directory, self.record)


def _number(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _wandb_info(trainer: pl.Trainer) -> dict | None:
    """Run/sweep ids of the W&B run Lightning's WandbLogger created on rank 0, if any."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            sweep = getattr(run, "sweep_id", None) or os.environ.get("WANDB_SWEEP_ID")
            return {"run_id": getattr(run, "id", None), "sweep_id": sweep, "project": getattr(run, "project", None)}
    return None
