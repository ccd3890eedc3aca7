"""Few-shot linear evaluation, the paper's metric (section 4.1): ridge regression from frozen features to {-1, 1}^K.

k training images per class are drawn with a fixed seed; a regularised least-squares map from their frozen
representation (the head's `pre_logits` when it has a hidden layer, else the pooled vector) to {-1, 1}^K
targets is solved in closed form; the score is top-1 on the validation split, averaged over several draws.

Two estimators (ESTIMATORS): `paper` (default) scales the features to unit RMS and chooses the regulariser
on other training images of the same draw; `big_vision` standardises each feature and fixes l2 = 2^10.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from torch import nn
from torch.utils.data import DataLoader, Subset
from typing_extensions import override

from vit_lightning.analysis.trained import load_trained
from vit_lightning.core.names import RECORD
from vit_lightning.core.parser import CommandParser
from vit_lightning.run import rundir
from vit_lightning.run.record import RunRecord
from vit_lightning.run.rundir import Busy, checkpoint_path, update_record

SHOTS = (1, 5, 10, 25)
DRAWS = 3
HOLDOUT = 10  # held-out training images per class, on which the regulariser is chosen
# Penalty per example on features scaled to unit RMS, so one grid suits any width, scale and k.
LAMBDAS = tuple(10.0**e for e in range(-4, 5))
ESTIMATORS = ("paper", "big_vision")
BIG_VISION_L2 = 2.0**10  # big_vision's fewshot l2_reg, on per-feature standardised features


def metric_names(k: int) -> tuple[str, str]:
    """The record's and loggers' names for the k-shot mean and its spread over draws."""
    return f"val/fewshot{k}", f"val/fewshot{k}_std"


# ---------------------------------------------------------------- the draw


def draw(labels: torch.Tensor, num_classes: int, shots: int, holdout: int, generator: torch.Generator):
    """Per class, `shots` training indices (C, shots) and up to `holdout` others (M,), from a private generator."""
    counts = torch.bincount(labels, minlength=num_classes)  # (C,)
    if int(counts.min()) <= shots:
        c = int(counts.argmin())
        raise ValueError(f"class {c} has {int(counts[c])} training images; {shots}-shot evaluation needs more")
    by_class = torch.split(torch.argsort(labels, stable=True), counts.tolist())
    pools, held = [], []
    for idx in by_class:
        idx = idx[torch.randperm(len(idx), generator=generator)]
        pools.append(idx[:shots])
        held.append(idx[shots : shots + holdout])
    return torch.stack(pools), torch.cat(held)


def draws_for(labels: torch.Tensor, num_classes: int, shots: int, draws: int, seed: int, holdout: int = HOLDOUT):
    """`draws` independent draws [(pool (C, shots), held (M,)), ...]; a k-shot set is pool[:, :k], nested in k."""
    generator = torch.Generator().manual_seed(seed)
    return [draw(labels, num_classes, shots, holdout, generator) for _ in range(draws)]


# ---------------------------------------------------------------- the probe


def ridge(x: torch.Tensor, y: torch.Tensor, lambdas) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin |x W + b - y|^2 + lam |W|^2 (bias not penalised) for each lam: W (L, D, K), b (L, K), float64.

    Centring removes the bias from the problem; one eigendecomposition of x^T x then serves every lam.
    """
    x, y = x.double(), y.double()  # (N, D), (N, K)
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    eigvals, q = torch.linalg.eigh(xc.T @ xc)  # (D,), (D, D)
    rhs = q.T @ (xc.T @ yc)  # (D, K)
    w = torch.stack([q @ (rhs / (eigvals.clamp_min(0) + lam)[:, None]) for lam in lambdas])  # (L, D, K)
    return w, my - mx @ w


def probe_accuracy(train_x, train_y, held_x, held_y, val_x, val_y, num_classes: int, lambdas=LAMBDAS,
                   estimator: str = "paper") -> float:
    """Val top-1 of the ridge map to {-1, 1}^K: `paper` picks the regulariser on the held-out images,
    `big_vision` standardises each feature and uses l2 = 2^10."""
    train_x, held_x = train_x.double().cpu(), held_x.double().cpu()
    mean = train_x.mean(0)  # (D,)
    if estimator == "big_vision":
        scale = train_x.std(0, unbiased=False).clamp_min(1e-12)  # (D,) each feature to unit std
        penalties = [BIG_VISION_L2]
    else:
        scale = (train_x - mean).square().mean().sqrt().clamp_min(1e-12)  # features to unit RMS
        penalties = [lam * len(train_y) for lam in lambdas]
    targets = 2.0 * F.one_hot(train_y.cpu(), num_classes).double() - 1.0  # (N, K) in {-1, 1}
    w, b = ridge((train_x - mean) / scale, targets, penalties)
    w = w / scale[:, None] if scale.ndim else w / scale  # the same maps, applied to raw features
    b = b - mean @ w
    best = 0
    if len(penalties) > 1:
        held = torch.stack([((held_x @ w[i] + b[i]).argmax(-1) == held_y.cpu()).double().mean() for i in range(len(w))])
        best = len(lambdas) - 1 - int(held.flip(0).argmax())  # ties go to the stronger regulariser
    # Validation can be large (50k ImageNet images): score it on its own device, in float32.
    scores = val_x @ w[best].to(val_x) + b[best].to(val_x)  # (V, K)
    return float((scores.argmax(-1) == val_y.to(val_x.device)).float().mean())


def score_draws(train_x, train_y, plans, val_x, val_y, num_classes: int, shots=SHOTS,
                estimator: str = "paper") -> dict[str, float]:
    """Mean and sample std over draws of the k-shot accuracy, for each k; plans index rows of train_x."""
    if not (torch.isfinite(train_x).all() and torch.isfinite(val_x).all()):
        return {name: float("nan") for k in shots for name in metric_names(k)}  # a diverged model
    out = {}
    for k in shots:
        accs = []
        for pool, held in plans:
            rows = pool[:, :k].flatten()
            accs.append(probe_accuracy(train_x[rows], train_y[rows], train_x[held], train_y[held],
                                       val_x, val_y, num_classes, estimator=estimator))
        mean_name, std_name = metric_names(k)
        out[mean_name] = float(np.mean(accs))
        out[std_name] = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
    return out


def fewshot_accuracy(train_x, train_y, val_x, val_y, num_classes: int, shots=SHOTS, draws: int = DRAWS,
                     seed: int = 0, estimator: str = "paper") -> dict[str, float]:
    """Few-shot scores from features already computed for the whole training split (N, D)."""
    check_estimator(estimator)
    plans = draws_for(train_y, num_classes, max(shots), draws, seed)
    return score_draws(train_x, train_y, plans, val_x, val_y, num_classes, shots, estimator)


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown few-shot estimator {estimator!r}; choose from: {', '.join(ESTIMATORS)}")


# ---------------------------------------------------------------- features of a frozen backbone


@contextmanager
def preserved_rng():
    """Leave Python's, NumPy's and torch's (CPU and CUDA) global random states as they were."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextmanager
def frozen(model: nn.Module):
    """Eval mode (no dropout) without gradients, restoring the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def extract(backbone: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """Probe features (N, D) float32 (`pre_logits` when the backbone has it) and labels (N,), on its device."""
    device = next(backbone.parameters()).device
    features = getattr(backbone, "pre_logits", backbone.forward_features)
    half = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float16
    feats, labels = [], []
    for x, y in loader:
        with torch.autocast(device.type, dtype=half, enabled=device.type == "cuda"):
            feats.append(features(x.to(device, non_blocking=True)).float())
        labels.append(y.to(device))
    return torch.cat(feats), torch.cat(labels)


def evaluate(backbone: nn.Module, datamodule, shots=SHOTS, draws: int = DRAWS, seed: int = 0,
             estimator: str = "paper") -> dict[str, float]:
    """Few-shot scores of a backbone (with pre_logits or forward_features) on a set-up ImageDataModule's splits.

    Only the drawn training images are passed through the model; the validation split is streamed once.
    """
    check_estimator(estimator)
    train_set, labels = datamodule.unaugmented_train()
    num_classes = datamodule.num_classes
    plans = draws_for(labels, num_classes, max(shots), draws, seed)
    needed = torch.unique(torch.cat([torch.cat([pool.flatten(), held]) for pool, held in plans]))  # sorted
    plans = [(torch.searchsorted(needed, pool), torch.searchsorted(needed, held)) for pool, held in plans]
    hp = datamodule.hparams

    def loader(dataset):
        return DataLoader(dataset, batch_size=hp.batch_size, num_workers=datamodule.workers,
                          collate_fn=datamodule.val_collate, generator=torch.Generator().manual_seed(0))

    with preserved_rng(), frozen(backbone):
        train_x, train_y = extract(backbone, loader(Subset(train_set, needed.tolist())))
        val_x, val_y = extract(backbone, loader(datamodule.val_set))
    return score_draws(train_x, train_y.cpu(), plans, val_x, val_y, num_classes, shots, estimator)


def describe(metrics: dict[str, float], shots) -> str:
    """'1-shot 0.4123±0.0301, 5-shot ...' for a log line."""
    return ", ".join(f"{k}-shot {metrics[metric_names(k)[0]]:.4f}±{metrics[metric_names(k)[1]]:.4f}" for k in shots)


# ---------------------------------------------------------------- during fit


class FewShotEval(pl.Callback):
    """Few-shot evaluation of the frozen backbone at the end of fit (and every `every` epochs), on rank 0.

    Logs `val/fewshot{k}` and `val/fewshot{k}_std` to the trainer's loggers and into the run record's metrics;
    training's random state is left as it was.
    """

    def __init__(self, shots=SHOTS, every: int = 0, draws: int = DRAWS, seed: int = 0, estimator: str = "paper"):
        shots = tuple(shots)
        if not shots or any(not isinstance(k, int) or k < 1 for k in shots) or draws < 1 or every < 0:
            raise ValueError(f"few-shot evaluation needs shots >= 1 (run.fewshot_shots), every >= 0 "
                             f"(run.fewshot_every) and draws >= 1; got {list(shots)}, {every}, {draws}")
        check_estimator(estimator)
        self.shots, self.every, self.draws, self.seed, self.estimator = shots, every, draws, seed, estimator
        self.metrics: dict[str, float] = {}
        self._done_at: int | None = None  # global step of the last evaluation

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every and (trainer.current_epoch + 1) % self.every == 0:
            self._evaluate(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._done_at != trainer.global_step:  # before teardown moves the model off its device
            self._evaluate(trainer, pl_module)

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._done_at = trainer.global_step
        if trainer.is_global_zero:
            self._evaluate_here(trainer, pl_module)
        trainer.strategy.barrier("fewshot")  # the other ranks wait rather than run ahead into a collective

    def _evaluate_here(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = trainer.datamodule
        if not hasattr(datamodule, "unaugmented_train"):
            rank_zero_warn("few-shot evaluation skipped: it needs a ImageDataModule")
            return
        start = time.perf_counter()
        try:
            self.metrics = evaluate(getattr(pl_module, "model", pl_module), datamodule, self.shots, self.draws,
                                    self.seed, self.estimator)
        except ValueError as error:  # a class too small for the largest k
            rank_zero_warn(f"few-shot evaluation skipped: {error}")
            return
        for logger in trainer.loggers:
            logger.log_metrics(self.metrics, step=trainer.global_step)
        for callback in trainer.callbacks:
            if isinstance(callback, RunRecord):
                callback.add_metrics(self.metrics)
        took = time.perf_counter() - start
        print(f"few-shot linear ({self.draws} draws): {describe(self.metrics, self.shots)} ({took:.1f}s)", flush=True)


# ---------------------------------------------------------------- afterwards: `vit-ablate fewshot`


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate fewshot",
                      description="Few-shot linear evaluation of a finished run; fills its results.json.")
    p.add_argument("path", metavar="RUN_DIR_OR_CHECKPOINT", help="a run directory (its last.ckpt) or a .ckpt file")
    p.add_argument("--shots", type=_positive, nargs="+", default=list(SHOTS),
                   help="k images per class (default: 1 5 10 25)")
    p.add_argument("--draws", type=_positive, default=DRAWS, help=f"draws of k images to average (default: {DRAWS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default: 0, as in fit)")
    p.add_argument("--estimator", choices=ESTIMATORS, default="paper",
                   help="paper (default: unit-RMS features, regulariser chosen on held-out images) or big_vision "
                        "(per-feature standardisation, l2 = 2^10)")
    p.add_argument("--data-root", default=None, help="where the run's data lives now, if it moved")
    p.add_argument("--device", type=_device, default="auto", help="auto (a GPU when there is one), cpu, cuda, cuda:1")
    return p


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """`vit-ablate fewshot RUN_DIR_OR_CHECKPOINT [--shots K ...] [--draws N] [--seed S] [--data-root DIR]`."""
    args = parser().parse_args(argv)
    try:
        # the run's lock held for the whole work: a fit training the run would overwrite the numbers
        with rundir.held(checkpoint_path(Path(args.path)).parent) as lock:
            model, datamodule, record, ckpt, _ = load_trained(Path(args.path), root=args.data_root)
            metrics = evaluate(model.model.to(args.device), datamodule, tuple(args.shots), args.draws, args.seed,
                               args.estimator)
            print(f"few-shot linear ({args.draws} draws): {describe(metrics, args.shots)}")
            if record is not None:  # read again under the lock: the record as it is now, with these numbers added
                update_record(ckpt.parent, lambda now: now.setdefault("metrics", {}).update(metrics), lock=lock)
                print(f"updated {ckpt.parent / RECORD}")
    except (ValueError, RuntimeError, OSError, Busy) as error:
        print(f"vit-ablate fewshot: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0
