"""ViTClassifier: the LightningModule that trains a ViT: loss, metrics, optimizer and schedule."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from vit_lightning.model import ViT
from vit_lightning.model.config import check_choice

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "linear", "constant")


class ViTClassifier(pl.LightningModule):
    """Image classification with a ViT built from plain options (all saved in the checkpoint)."""

    def __init__(
        self,
        variant: str = "micro",
        patch_size: int = 7,
        pos_encoding: str = "learned_1d",
        pos_injection: str = "stem",
        pooling: str = "cls",
        stem: str = "patch",
        hybrid_layers: tuple[int, ...] = (3, 4, 9),
        hybrid_width: int = 64,
        head: str = "linear",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        width: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        mlp_dim: int | None = None,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        optimizer: str = "adamw",
        lr: float = 2e-3,
        weight_decay: float = 0.05,
        momentum: float = 0.9,
        warmup_epochs: float = 1.0,
        schedule: str = "cosine",
        label_smoothing: float = 0.0,
        compile: bool = False,
    ):
        """Model options as in ViT (img_size, in_chans, num_classes come from the data); then the optimizer's.

        Args:
            variant: size preset: micro (CPU demo), Ti, S, B, L, H; width/depth/heads/mlp_dim override it.
            patch_size: side of the square patches (the hybrid stem's stride replaces it).
            pos_encoding: none, learned_1d, learned_2d, sincos_2d, relative_1d, relative_bias_2d.
            pos_injection: stem, every_layer, every_layer_shared.
            pooling: cls, gap, map.
            stem: patch or hybrid (BiT ResNet stages `hybrid_layers`, root width `hybrid_width`).
            head: linear or mlp_tanh.
            img_size: input side in pixels; `vit-ablate fit` sets it from the data.
            in_chans: input channels; `vit-ablate fit` sets it from the data.
            num_classes: output classes; `vit-ablate fit` sets it from the data.
            optimizer: adamw or sgd (with `momentum`).
            lr: peak learning rate, reached after `warmup_epochs` of linear warm-up.
            weight_decay: decoupled (AdamW) or L2 (SGD); never applied to norms, biases, position tables, tokens.
            schedule: decay after warm-up, per optimizer step: cosine, linear or constant.
            label_smoothing: cross-entropy label smoothing (also applied to mixup/cutmix soft targets).
            compile: torch.compile the ViT (in place: parameter names and checkpoints stay the same).
        """
        super().__init__()
        check_choice("model.optimizer", optimizer, OPTIMIZERS)
        check_choice("model.schedule", schedule, SCHEDULES)
        if lr <= 0 or weight_decay < 0 or warmup_epochs < 0 or not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                "need model.lr > 0, model.weight_decay >= 0, model.warmup_epochs >= 0, 0 <= model.label_smoothing < 1;"
                f" got {lr}, {weight_decay}, {warmup_epochs}, {label_smoothing}"
            )
        # Plain lists, not tuples, so hparams.yaml and the checkpoint stay plain (weights_only loading).
        hybrid_layers = list(hybrid_layers)
        img_size = list(img_size) if isinstance(img_size, (tuple, list)) else img_size
        self.save_hyperparameters()
        self.model = ViT(
            variant, img_size=img_size, in_chans=in_chans, num_classes=num_classes, patch_size=patch_size,
            width=width, depth=depth, heads=heads, mlp_dim=mlp_dim, pos_encoding=pos_encoding,
            pos_injection=pos_injection, pooling=pooling, stem=stem, hybrid_layers=tuple(hybrid_layers),
            hybrid_width=hybrid_width, head=head, dropout=dropout, attn_dropout=attn_dropout,
        )
        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def configure_model(self) -> None:
        """Compile once, when the trainer sets the model up (before DDP wraps it)."""
        if self.hparams.compile and getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # (B, C, H, W) -> (B, num_classes)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy on class ids (B,) or soft targets (B, num_classes) from mixup/cutmix."""
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.hparams.label_smoothing)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        loss = self.loss(logits, targets)
        hard = targets if targets.ndim == 1 else targets.argmax(dim=1)  # soft labels: the dominant class
        self.train_acc(logits, hard)
        n = images.shape[0]
        self.log("train/loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=n)
        self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=n)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=n)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        n = images.shape[0]
        self.val_acc(logits, targets)
        self.val_acc5(logits, targets)
        # torchmetrics objects sync their state across ranks; the loss mean is synced by Lightning.
        self.log("val/loss", self.loss(logits, targets), on_epoch=True, sync_dist=True, batch_size=n)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True, batch_size=n)
        self.log("val/acc5", self.val_acc5, on_epoch=True, batch_size=n)

    def configure_optimizers(self):
        hp = self.hparams
        groups = self._param_groups(hp.weight_decay)
        if hp.optimizer == "adamw":
            opt = torch.optim.AdamW(groups, lr=hp.lr, betas=(0.9, 0.999))
        else:
            opt = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = round(hp.warmup_epochs * self._steps_per_epoch(total))
        factor = _lr_factor(hp.schedule, warmup, total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _param_groups(self, weight_decay: float) -> list[dict]:
        """Decay matrices only: norms, biases (ndim <= 1), position tables and tokens are not decayed."""
        skip = self.model.no_weight_decay()
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                exempt = p.ndim <= 1 or name in skip or any(name.startswith(s + ".") for s in skip)
                (no_decay if exempt else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def _steps_per_epoch(self, total: int) -> float:
        """Optimizer steps in one epoch on this rank (falls back to all steps when unknown)."""
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches) or batches <= 0:
            return float(total)
        return math.ceil(batches / self.trainer.accumulate_grad_batches)


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

