"""Whether a model uses position: its top-1 when the patches of every validation image are shuffled.

Each image is cut into P x P pixel blocks, P the model's `patch_size`, and the blocks are put back in another
order: the same few permutations (PERMUTATIONS, drawn from SEED) for every image and every run. A ViT blind to
position (no encoding, [class] or average pooling) gives the shuffled image the logits of the intact one up to
float rounding: its blocks are permutation-equivariant and its pooling invariant. `val/acc_shuffled` is the mean
top-1 over the permutations, `val/shuffle_drop` the top-1 on the intact images minus it (both from one pass over
the batches fit validates on, so the intact top-1 is the record's val/acc when the last epoch validated).

What a block is depends on the stem. Patch stem: a block is a token, so only the tokens' order changes. Hybrid
stem: `patch_size` is the image area of one token only where it equals the ResNet's stride (the hybrid ablation
sets it so), and the ResNet's receptive fields cross the blocks' edges, so a shuffle also changes what tokens see
at the seams: its drop mixes position with content. A family with attention windows (the demo's patch 2): a block
is a first-stage token, but windows and patch merging group neighbouring tokens, so the drop measures how much the
whole hierarchy relies on the layout, not its position encoding alone (without an encoding it drops too).
"""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from vit_lightning.analysis.fewshot import frozen, preserved_rng
from vit_lightning.core.names import SHUFFLE_DROP, SHUFFLED_ACC
from vit_lightning.model.family import TOKEN_GRID, family_of
from vit_lightning.run.record import RunRecord

PERMUTATIONS = 3  # shuffles per image; each costs one more forward pass over the validation batches
SEED = 0  # the permutations' seed: the same blocks moved the same way in every run


def permutations(n: int, count: int = PERMUTATIONS, seed: int = SEED) -> list[torch.Tensor]:
    """`count` fixed orders (n,) of n blocks from a private generator; none is the identity (n >= 2)."""
    generator, out = torch.Generator().manual_seed(seed), []
    while len(out) < count:
        perm = torch.randperm(n, generator=generator)
        if n < 2 or not torch.equal(perm, torch.arange(n)):
            out.append(perm)
    return out


def shuffle_blocks(x: torch.Tensor, block: int, perm: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) images whose block x block pixel blocks (raster order) are reordered: block i <- block perm[i]."""
    b, c, h, w = x.shape
    gh, gw = h // block, w // block
    blocks = x.reshape(b, c, gh, block, gw, block).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, block, block)
    blocks = blocks[:, perm.to(x.device)]  # (B, N, C, P, P)
    return blocks.reshape(b, gh, gw, c, block, block).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def block_error(shape, block: int) -> str | None:
    """Why (B, C, H, W) images cannot be cut into block x block blocks, or None."""
    if not block or any(side % block for side in shape[-2:]):
        return f"the image size {tuple(shape[-2:])} is not a multiple of patch_size={block}"
    return None


def shuffled_accuracy(model: torch.nn.Module, batches, block: int, count: int = PERMUTATIONS,
                      seed: int = SEED) -> dict[str, float]:
    """val/acc_shuffled and val/shuffle_drop of `model` (eval mode, no gradients) over (x, y) batches.

    ValueError when the images are not whole blocks.
    """
    device = next(model.parameters()).device
    hits, n, perms = [0] * (count + 1), 0, None  # hits[0]: the intact images
    with preserved_rng(), frozen(model):
        for x, y in batches:
            if perms is None:
                if error := block_error(x.shape, block):
                    raise ValueError(error)
                perms = permutations((x.shape[-2] // block) * (x.shape[-1] // block), count, seed)
            x, y = x.to(device), y.to(device)
            for i, perm in enumerate([None, *perms]):
                seen = x if perm is None else shuffle_blocks(x, block, perm)
                hits[i] += int((model(seen).argmax(-1) == y).sum())
            n += len(y)
    intact, shuffled = hits[0] / n, sum(hits[1:]) / (count * n)
    return {SHUFFLED_ACC: shuffled, SHUFFLE_DROP: intact - shuffled}


def validation_batches(trainer: pl.Trainer):
    """The validation batches fit validates on (its limit_val_batches), from a fresh loader, on this rank."""
    loader = trainer.datamodule.val_dataloader()
    limit = trainer.limit_val_batches
    count = limit if isinstance(limit, int) else math.ceil(limit * len(loader))
    return (batch for _, batch in zip(range(count), loader))


class ShuffledAccuracy(pl.Callback):
    """At the end of fit, on rank 0: val/acc_shuffled and val/shuffle_drop of the final weights, into the record
    and the loggers (`count` permutations; skipped with a warning when the images are not whole patches)."""

    def __init__(self, count: int = PERMUTATIONS):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"run.shuffle_perms must be a count of permutations >= 1 (0: off), got {count!r}")
        self.count = count

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:  # before teardown moves the model off its device
            self._measure(trainer, getattr(pl_module, "model", pl_module))
        trainer.strategy.barrier("shuffled")  # the other ranks wait rather than run ahead into a collective

    def _measure(self, trainer: pl.Trainer, model: torch.nn.Module) -> None:
        start = time.perf_counter()
        if line := family_of(model).lacks(TOKEN_GRID, "the shuffled-patch accuracy"):
            rank_zero_warn(f"shuffled-patch accuracy skipped: {line}")
            return
        try:
            metrics = shuffled_accuracy(model, validation_batches(trainer), model.config.patch_size, self.count)
        except ValueError as error:
            rank_zero_warn(f"shuffled-patch accuracy skipped: {error}")
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        for callback in trainer.callbacks:
            if isinstance(callback, RunRecord):
                callback.add_metrics(metrics)
        print(f"shuffled patches ({self.count} permutations): top-1 {metrics[SHUFFLED_ACC]:.4f}, "
              f"drop {metrics[SHUFFLE_DROP]:+.4f} ({time.perf_counter() - start:.1f}s)", flush=True)
