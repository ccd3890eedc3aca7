"""`vit-ablate eval SOURCE [--data.KEY=VALUE ...]`: top-1, top-5, loss and few-shot of a trained model, no training.

SOURCE is what `fit --model.init_from` takes (a run dir, a .ckpt, timm:NAME, timm:NAME@FILE). The data
defaults to the run's own; any `--data.*` option changes it (another dataset, another img_size), and the
position encoding is resampled as fine-tuning would resample it. The numbers go to a JSON record beside
the checkpoint (or --out), or into the run's results.json with --into-record.

StartAccuracy is fit's callback for a run started from a trained model: the same top-1 before fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import yaml
from typing_extensions import override

from vit_lightning import fewshot
from vit_lightning.bookkeeping import BEST_METRIC, RECORD, now, write_atomic
from vit_lightning.identity import plain
from vit_lightning.record import RunRecord
from vit_lightning.rundir import Busy, check_free, checkpoint_path, update_record
from vit_lightning.trained import TrainedError, build_data
from vit_lightning.transfer import RESAMPLE, TIMM, Source, SourceError, read_source, start_from


@torch.no_grad()
def accuracy(vit: torch.nn.Module, loader, progress: bool = False) -> dict[str, float]:
    """Top-1, top-5 (top-K when K < 5 classes) and mean cross-entropy of `vit` over a loader, in eval mode."""
    device = next(vit.parameters()).device
    was_training, (hits1, hits5, loss, n) = vit.training, (0, 0, 0.0, 0)
    vit.eval()
    batches = loader
    if progress:
        from rich.progress import track

        batches = track(loader, description="evaluating", transient=True)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = vit(x).float()  # (B, K)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices  # (B, 5)
        hits1 += int((top[:, 0] == y).sum())
        hits5 += int((top == y[:, None]).any(1).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        n += len(y)
    vit.train(was_training)
    return {"val/acc": hits1 / n, "val/acc5": hits5 / n, "val/loss": loss / n}


class StartAccuracy(pl.Callback):
    """Into the record: the source's own accuracy and, before any fine-tuning, the accuracy on the new data.

    `transfer/source_acc` is the source record's val/acc_best (at its resolution); `transfer/start_acc` the
    started model's top-1 on the validation batches fit validates on (resampled encodings, no training).
    """

    def __init__(self, source: Source):
        self.metrics = {"transfer/source_acc": (source.account.get("metrics") or {}).get(BEST_METRIC)}

    @override
    def state_dict(self) -> dict:
        return dict(self.metrics)  # a resumed run keeps the numbers measured before it first trained

    @override
    def load_state_dict(self, state: dict) -> None:
        self.metrics = dict(state)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == 0 and trainer.is_global_zero:
            loader = trainer.datamodule.val_dataloader()
            limit = trainer.limit_val_batches
            count = limit if isinstance(limit, int) else math.ceil(limit * len(loader))
            batches = (batch for _, batch in zip(range(count), loader))
            self.metrics["transfer/start_acc"] = accuracy(pl_module.model, batches)["val/acc"]
        for callback in trainer.callbacks:
            if isinstance(callback, RunRecord):
                callback.add_metrics(self.metrics)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vit-ablate eval", description=__doc__.split(":", 1)[1].strip().split("\n")[0])
    p.add_argument("source", help="a run dir, a .ckpt, timm:NAME or timm:NAME@FILE")
    p.add_argument("--pos-resample", choices=RESAMPLE, default="bicubic", help="interpolation of learned tables")
    p.add_argument("--shots", type=int, nargs="*", default=list(fewshot.SHOTS), help="few-shot k ([]: none)")
    p.add_argument("--out", type=Path, default=None, help="JSON record to write (default: beside the checkpoint)")
    p.add_argument("--into-record", action="store_true", help="also add the numbers to the run's results.json")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1")
    return p


def data_changes(extra: list[str]) -> dict:
    """--data.KEY=VALUE options as {KEY: value} (values read as YAML: 56, true, cifar10); ValueError otherwise."""
    out = {}
    for arg in extra:
        key, sep, value = arg.partition("=")
        if not key.startswith("--data.") or not sep:
            raise ValueError(f"unknown option {arg!r}: only --data.KEY=VALUE options change the data")
        out[key[len("--data."):]] = yaml.safe_load(value)
    return out


def run(args, changes: dict) -> tuple[dict, Path]:
    """The evaluation record of args.source on its (changed) data, and where it goes."""
    source = read_source(args.source)
    if source.data is None and "name" not in changes:
        raise SourceError(f"{args.source} names no data: give --data.name (and --data.img_size)")
    datamodule = build_data(source.data or {}, **changes)
    from vit_lightning.model import ViT

    vit = ViT(**{**source.options, "img_size": datamodule.img_size, "in_chans": datamodule.in_chans,
                 "num_classes": datamodule.num_classes})
    start_from(vit, source, args.pos_resample)
    vit.to(args.device)
    metrics = accuracy(vit, datamodule.val_dataloader(), progress=sys.stderr.isatty())
    if args.shots:
        metrics.update(fewshot.evaluate(vit, datamodule, tuple(args.shots)))
    options = {**(source.data or {}), **changes}
    record = {"source": source.account, "data": options, "img_size": datamodule.img_size,
              "pos_resample": args.pos_resample, "metrics": metrics, "finished_at": now()}
    name = f"eval-{options.get('name', 'data')}-{datamodule.img_size}px.json"
    beside = Path(source.account["file"]).parent if source.account.get("file") else Path(".")
    return record, args.out or beside / name


def add_eval(record: dict):
    """The change that files an evaluation record under the run record's `eval`, as `<data>@<size>px`."""
    def change(run_record: dict) -> None:
        run_record.setdefault("eval", {})[f"{record['data'].get('name')}@{record['img_size']}px"] = record["metrics"]
    return change


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    into = args.into_record and not args.source.startswith(TIMM)
    try:
        changes = data_changes(extra)
        if into:  # a fit training the run would overwrite the numbers: say so before the work
            check_free(checkpoint_path(Path(args.source)).parent)
        record, out = run(args, changes)
        if into:  # first, so a refusal writes nothing
            directory = Path(record["source"]["file"]).parent
            update_record(directory, add_eval(record))
        write_atomic(out, (json.dumps(plain(record), indent=2) + "\n").encode())
    except (ValueError, TrainedError, OSError, Busy) as error:
        print(f"vit-ablate eval: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    m = record["metrics"]
    print(f"top-1 {m['val/acc']:.4f}, top-5 {m['val/acc5']:.4f}, loss {m['val/loss']:.4f}"
          + (f", {fewshot.describe(m, args.shots)}" if args.shots else "") + f"\nwrote {out}")
    if into:
        print(f"updated {directory / RECORD}")
    return 0
