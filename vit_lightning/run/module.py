"""Classifier: the LightningModule that trains a backbone of any family: loss, metrics, optimizer and schedule.

ViTClassifier is its earlier name, kept as an alias.
"""

from __future__ import annotations

import functools
import math

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from vit_lightning.compat.torch import batch_dynamic
from vit_lightning.core.checks import range_error
from vit_lightning.model import ViT, build_backbone
from vit_lightning.model.config import check_choice
from vit_lightning.run.transfer import RESAMPLE, Start, read_source

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
# (low, high, low open, high open) of each number: finite, and wide enough for any real setting
OPTIMIZER_RANGES = {"lr": (0, 10, True), "weight_decay": (0, 10), "warmup_epochs": (0, 1e6),
                    "label_smoothing": (0, 1, False, True), "momentum": (0, 1, False, True)}


TRAIN_SUMS = "train_epoch_sums"  # the checkpoint's entry for the cut epoch's training sums


def check_options(optimizer: str, schedule: str, pos_resample: str, numbers: dict) -> None:
    """The optimizer's choices and numbers: ValueError naming the first one out of its choices or range."""
    check_choice("model.optimizer", optimizer, OPTIMIZERS)
    check_choice("model.schedule", schedule, SCHEDULES)
    check_choice("model.pos_resample", pos_resample, RESAMPLE)
    for key, bounds in OPTIMIZER_RANGES.items():
        if error := range_error(f"model.{key}", numbers[key], *bounds):
            raise ValueError(error)


class Classifier(pl.LightningModule):
    """Image classification with a backbone of any family built from plain options (all saved in the checkpoint)."""

    def __init__(
        self,
        optimizer: str = "adamw",
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        momentum: float = 0.9,
        warmup_epochs: float = 1.0,
        schedule: str = "cosine",
        label_smoothing: float = 0.0,
        compile: bool = False,
        init_from: str | None = None,
        pos_resample: str = "bicubic",
        new_head: bool = False,
        **backbone,
    ):
        """The optimizer's options; `backbone` takes ModelConfig's (variant, patch_size, pos_encoding, ...).

        `vit-ablate fit` offers every ModelConfig field as `--model.<field>` and sets img_size, in_chans
        and num_classes from the data.

        Args:
            optimizer: adamw or sgd (with `momentum`).
            lr: peak learning rate, reached after `warmup_epochs` of linear warm-up.
            weight_decay: decoupled (AdamW) or L2 (SGD); never applied to norms, biases, position tables, tokens.
            momentum: SGD's momentum (AdamW uses betas 0.9, 0.999).
            warmup_epochs: epochs (fractions allowed) of linear warm-up, counted in optimizer steps.
            schedule: decay after warm-up, per optimizer step: cosine, linear or constant.
            label_smoothing: cross-entropy label smoothing (also applied to mixup/cutmix soft targets).
            compile: torch.compile the ViT's forward for training and for evaluation, each once (parameter names
                and checkpoints stay the same; see `compiled_forwards`).
            init_from: start from a trained model: a run dir, a .ckpt, timm:NAME or timm:NAME@FILE (its
                architecture options are taken from it; see transfer.py).
            pos_resample: how learned position tables follow a new data.img_size: bicubic, bilinear or nearest
                (interpolated), or keep (trained entries kept bit for bit, beyond the trained range the edge ones).
            new_head: with init_from, a zero-initialised head even when the classes are the same.
        """
        super().__init__()
        check_options(optimizer, schedule, pos_resample, dict(lr=lr, weight_decay=weight_decay,
                      warmup_epochs=warmup_epochs, label_smoothing=label_smoothing, momentum=momentum))
        self.model = build_backbone(**backbone)  # the family chosen by model.arch
        # Plain lists, not tuples, so the checkpoint stays plain (weights_only loading).
        backbone = {k: list(v) if isinstance(v, tuple) else v for k, v in backbone.items()}
        self.save_hyperparameters()
        num_classes = self.model.config.num_classes
        top5 = min(5, num_classes)
        # validate_args=False: no shape and type checks in Python on every step; the model's (B, num_classes)
        # logits and the data's class ids are valid by construction
        accuracy = functools.partial(MulticlassAccuracy, num_classes, average="micro", validate_args=False)
        self.train_acc, self.val_acc, self.val_acc5 = accuracy(top_k=1), accuracy(top_k=1), accuracy(top_k=top5)
        # stage -> (sum of loss x batch size on the device, samples counted on the host) this epoch
        self._loss_sums: dict[str, tuple[torch.Tensor, int]] = {}
        self.start: Start | None = None  # init_from as fit resolved it (FitCLI sets it); read here when built alone
        self._started_from = False  # the init_from weights are loaded once, by the first configure_model
        self._resumed_sums: dict | None = None  # the cut epoch's training sums from the checkpoint, until training
        self._compiled: dict | None = None  # model.compile: {"train": fn, "eval": fn} (compiled_forwards)

    @override
    def configure_model(self) -> None:
        """Start from init_from unless resuming (before the checkpoint restores), then compile once (before DDP)."""
        hp = self.hparams
        if hp.init_from and not self._started_from and self.trainer.ckpt_path is None:
            self.start = self.start or Start(read_source(hp.init_from), hp.pos_resample, hp.new_head)
            self.start.load_into(self.model)
        self._started_from = True
        if self.hparams.compile and self._compiled is None:  # configure_model runs again on every fit/validate/test
            self._compiled = compiled_forwards(self.model)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._compiled is None:
            return self.model(x)  # (B, C, H, W) -> (B, num_classes)
        mode = "train" if self.training and torch.is_grad_enabled() else "eval"
        return self._compiled[mode](batch_dynamic(x))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy on class ids (B,) or soft targets (B, num_classes) from mixup/cutmix."""
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.hparams.label_smoothing)

    # Per-step self.log calls and torchmetrics' forward (which also computes each batch's value) cost
    # a tenth of a CPU demo trial, and on a GPU each host sync stalls the step; so the epoch's sums are
    # kept on the device and logged once per epoch, and the per-step values only on the steps Lightning
    # writes out (every trainer.log_every_n_steps): a training step reads nothing back from the device.
    @override
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        loss = self.loss(logits, targets)
        hard = targets if targets.ndim == 1 else targets.argmax(dim=1)  # soft labels: the dominant class
        self.train_acc.update(logits.detach(), hard)
        self._add_loss("train", loss, images.shape[0])
        if (self.global_step + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=1)
            self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=1)
        if self.trainer.is_last_batch:  # callbacks read train/* in on_train_epoch_end, before this module's hook
            self._log_epoch("train", {"acc": self.train_acc})
        return loss

    @override
    def validation_step(self, batch, batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.val_acc.update(logits, targets)
        self.val_acc5.update(logits, targets)
        self._add_loss("val", self.loss(logits, targets), images.shape[0])

    @override
    def on_train_epoch_start(self) -> None:
        self._loss_sums.pop("train", None)
        self.train_acc.reset()

    @override
    def on_validation_epoch_start(self) -> None:
        self._loss_sums.pop("val", None)
        self.val_acc.reset()
        self.val_acc5.reset()

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", {"acc": self.val_acc, "acc5": self.val_acc5})

    @override
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The cut epoch's training sums (all ranks' added up), so a fit resumed mid-epoch averages all its batches."""
        if "train" not in self._loss_sums:  # an epoch's last step logs and drops them: nothing is cut
            return
        total, count = self._loss_sums["train"]
        sums = {"loss": torch.as_tensor(total).detach().double().reshape(1), "count": torch.tensor([count]),
                **{f"acc.{k}": v.detach().clone() for k, v in self.train_acc.metric_state.items()}}
        if self.trainer.world_size > 1:
            sums = {k: v.to(self.device) for k, v in sums.items()}
            for value in sums.values():
                torch.distributed.all_reduce(value)
        checkpoint[TRAIN_SUMS] = {k: v.cpu() for k, v in sums.items()}

    @override
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._resumed_sums = checkpoint.get(TRAIN_SUMS)

    @override
    def on_train_start(self) -> None:
        sums, self._resumed_sums = self._resumed_sums, None
        if not sums or self.global_rank != 0:  # the other ranks start from zero: each epoch's end adds all ranks up
            return
        self._loss_sums["train"] = (sums["loss"].to(self.device, torch.float32).reshape(()), int(sums["count"]))
        for name, value in self.train_acc.metric_state.items():
            setattr(self.train_acc, name, sums[f"acc.{name}"].to(value.device, value.dtype))

    def _add_loss(self, stage: str, loss: torch.Tensor, n: int) -> None:
        """Add a batch's mean loss, weighted by its size, to the epoch's (sum, count); no host-to-device copy."""
        total, count = self._loss_sums.get(stage, (0.0, 0))
        self._loss_sums[stage] = (loss.detach().float() * n + total, count + n)

    def _log_epoch(self, stage: str, metrics: dict) -> None:
        """Log the epoch's mean loss and the torchmetrics' values, both over every rank's samples."""
        if stage not in self._loss_sums:
            return
        total, count = self._loss_sums.pop(stage)
        sums = torch.stack([total, total.new_tensor(float(count))])  # once an epoch
        total, count = self.trainer.strategy.reduce(sums, reduce_op="sum")
        values = {"loss": total / count}
        for name, metric in metrics.items():  # compute() syncs a metric's counts across ranks
            values[name] = metric.compute()
            metric.reset()
        for name, value in values.items():  # equal on every rank already; sync_dist only keeps Lightning quiet
            self.log(f"{stage}/{name}", value, on_step=False, on_epoch=True, sync_dist=True, batch_size=1,
                     prog_bar=(stage, name) == ("val", "acc"))

    @override
    def configure_optimizers(self):
        hp = self.hparams
        groups = decay_groups(self.model, hp.weight_decay)
        if hp.optimizer == "adamw":
            # The fused kernel updates every tensor in one call: a fifth of the unfused time on a CPU. Lightning's
            # mixed-precision plugins refuse to clip gradients for it (it would unscale them itself), so full
            # precision only.
            full = str(self.trainer.precision) in ("32-true", "64-true")
            fused = (full and all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])) or None
            opt = torch.optim.AdamW(groups, lr=hp.lr, betas=(0.9, 0.999), fused=fused)
        else:
            opt = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = round(hp.warmup_epochs * self._steps_per_epoch(total))
        factor = _lr_factor(hp.schedule, warmup, total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _steps_per_epoch(self, total: int) -> float:
        """Optimizer steps in one epoch on this rank (falls back to all steps when unknown)."""
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches) or batches <= 0:
            return float(total)
        return math.ceil(batches / self.trainer.accumulate_grad_batches)


ViTClassifier = Classifier  # its earlier name (alias): it trains every family, not the ViT only


def compiled_forwards(model: torch.nn.Module) -> dict:
    """{"train": fn, "eval": fn}: the model's forward compiled twice, as two functions.

    One compiled forward would recompile on every switch between training and validation (grad mode and
    the modules' training flags are guards) and on each split's short last batch. Two functions are two
    code objects with a compile cache each, so each compiles once; the caller marks the batch dimension
    dynamic, so a short batch reuses the graph. Analyses after fit (few-shot, shuffled patches) call the
    model itself, eagerly: they would otherwise compile graphs used once.
    """

    def train(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    return {"train": torch.compile(train), "eval": torch.compile(evaluate)}


def decay_groups(model: ViT, weight_decay: float) -> list[dict]:
    """Decay matrices only: norms, biases (ndim <= 1), position tables and tokens are not decayed."""
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt = p.ndim <= 1 or name in skip or any(name.startswith(s + ".") for s in skip)
            (no_decay if exempt else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _lr_factor(schedule: str, warmup: int, total: int):
    """Multiplier of the peak lr at optimizer step s: linear warm-up to 1, then the schedule's decay."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return factor

