"""Where a demo trial's time goes: start-up, training compute, Lightning's step overhead, validation,
checkpointing, logging; and a plain PyTorch loop doing the same epoch, for comparison.

Run (one thread, as a sweep trial runs):
    OMP_NUM_THREADS=1 python -m vit_lightning.commands.bench.trial_split [--epochs 9] [--plain-epochs 3] [extra fit options]

`--sweep runs/ABLATION/PROFILE ...` instead splits the trials of a finished local sweep (the sweep's time per
trial, fit's own, the training steps'), for comparing how trials are started (`--fresh-processes` or not).

Every part is timed around the function that does it, inside one `vit-ablate fit` run of the demo
profile, in CPU seconds of this process (time.process_time; one thread): on a shared machine other
people's work then inflates the parts alike instead of whichever ran while the machine was busiest.
`--clock wall` times wall seconds (time.perf_counter) instead, for an idle machine.
"""

from __future__ import annotations

import functools
import importlib
import sys
import tempfile
import time
from collections import defaultdict

from vit_lightning.core.defaults import DEMO
from vit_lightning.core.parser import CommandParser

CLOCK = time.process_time
SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


ACTIVE: dict[str, int] = defaultdict(int)


def timed(owner, name: str, key, group: str | None = None) -> None:
    """Wrap owner.name so that its time adds to SECONDS[key]; calls nested in a call of the same group count once.

    `key` is a name, or a function of the call's arguments that returns one.
    """
    original = getattr(owner, name)
    group = group or f"{owner}.{name}"

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if ACTIVE[group]:
            return original(*args, **kwargs)
        ACTIVE[group] += 1
        start = CLOCK()
        try:
            return original(*args, **kwargs)
        finally:
            label = key(*args) if callable(key) else key
            SECONDS[label] += CLOCK() - start
            CALLS[label] += 1
            ACTIVE[group] -= 1

    setattr(owner, name, wrapper)


MODE = {True: " (train)", False: " (eval)"}
# the default family's default position encoding (model.pos_encoding left unset)
ARGV = ["--data.batch_size=32", "--data.name=mnist5k", "--data.random_crop=False", "--model.lr=0.002",
        "--model.patch_size=7", "--model.variant=micro",
        "--model.warmup_epochs=1", "--run.ablation=split", "--run.profile=demo", "--seed_everything=0",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--run.wandb=off"]


def instrument() -> None:
    """Time the parts of a fit that are not the training step itself."""
    import lightning.pytorch as pl
    import torchmetrics
    from lightning.pytorch.plugins.precision.precision import Precision
    from torchmetrics.classification.stat_scores import MulticlassStatScores

    from vit_lightning.commands.fit import cli as fitcli
    from vit_lightning.compat.lightning import loop_classes
    from vit_lightning.data import datamodule as data
    from vit_lightning.model import vit
    from vit_lightning.run import module, record

    timed(fitcli.FitCLI, "__init__", "start-up: parse options, build data module, model, trainer")
    timed(module.Classifier, "__init__", "start-up: build the model")
    timed(data.ImageDataModule, "setup", "start-up: load the data")
    timed(record, "gflops_per_image", "start-up: count GFLOPs")
    timed(pl.Trainer, "_run_sanity_check", "start-up: sanity validation")
    timed(pl.Trainer, "fit", "fit (everything after the trainer exists)")
    training_epoch_loop, evaluation_loop = loop_classes()
    timed(training_epoch_loop, "run", "epochs (train + validation)")
    timed(evaluation_loop, "run", "validation loops (incl. sanity)")
    timed(pl.Trainer, "save_checkpoint", "checkpointing")
    timed(record, "write_record", "record writes")
    timed(fitcli.EpochPrinter, "on_train_epoch_end", "progress printing")
    timed(pl.LightningModule, "log", lambda module, *_: "self.log" + MODE[module.training])
    # update before the instances wrap it; an update inside forward counts once
    timed(torchmetrics.Metric, "forward", lambda metric, *_: "torchmetrics" + MODE[metric.training], "metrics")
    timed(MulticlassStatScores, "update", lambda metric, *_: "torchmetrics" + MODE[metric.training], "metrics")
    timed(vit.ViT, "forward", lambda model, *_: "model forward" + MODE[model.training])
    timed(pl.LightningModule, "backward", "backward")
    timed(importlib.import_module("torch.optim.adam"), "adam", "optimizer update")
    timed(Precision, "clip_gradients", "gradient clipping")
    timed(data.BatchCollate, "__call__", "batch collate")


def plain_epochs(epochs: int, fused: bool) -> tuple[float, float]:
    """Seconds per epoch of a bare PyTorch loop (train, then validation) on the same model, data and optimizer."""
    import torch
    import torch.nn.functional as F

    from vit_lightning.data.datamodule import ImageDataModule
    from vit_lightning.run.module import Classifier, _lr_factor

    torch.manual_seed(0)
    dm = ImageDataModule(name="mnist5k", batch_size=32, random_crop=False)
    dm.setup()
    model = Classifier(patch_size=7, img_size=28, in_chans=1, num_classes=10, lr=0.002).model
    opt = torch.optim.AdamW(model.parameters(), lr=0.002, weight_decay=0.05, fused=fused)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor("cosine", len(train), len(train) * epochs))
    t_train = t_val = 0.0
    for _ in range(epochs):
        start = CLOCK()
        model.train()
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        mid = CLOCK()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val:
                correct += (model(x).argmax(1) == y).sum().item()
        t_train += mid - start
        t_val += CLOCK() - mid
    return t_train / epochs, t_val / epochs


def sweep_split(folders: list[str], trials: int | None = None) -> list[str]:
    """Where the wall time of a finished local sweep's trials went, from its state file and the trials' records.

    Per trial: the sweep's start-to-exit time (state file, 1 s resolution), fit's own time from setup to its
    end (record `compute.wall_s`: training, validation, checkpoints, few-shot), and the training steps alone
    (steps x batch / `compute.train_images_per_s`). Outside fit: start-up (imports, options, model) and exit.
    `trials`: the first N finished trials of each folder, in the order they started.
    """
    import json
    from datetime import datetime
    from pathlib import Path

    from vit_lightning.run.rundir import read_record

    lines = []
    for folder in folders:
        state = json.loads((Path(folder) / ".sweep-state.json").read_text())["trials"]
        done = sorted((t["started_at"], tid, t) for tid, t in state.items() if t.get("status") == "completed")
        rows = []
        for _, tid, entry in done[:trials]:
            record = read_record(Path(folder) / tid)
            total = (datetime.fromisoformat(entry["finished_at"]) - datetime.fromisoformat(entry["started_at"]))
            compute, steps = record["compute"], record["metrics"]["steps"]
            train = steps * record["config"]["data.batch_size"] / compute["train_images_per_s"]
            rows.append((total.total_seconds(), compute["wall_s"], train))
        n = len(rows)
        total, fit, train = (sum(r[k] for r in rows) / n for k in range(3))
        lines.append(f"{folder}: {n} trials, mean seconds per trial (share of the whole trial)")
        for label, value in (("whole trial, as the sweep saw it", total), ("training steps", train),
                             ("validation, checkpoints, few-shot (rest of fit)", fit - train),
                             ("outside fit: start-up and exit", total - fit)):
            lines.append(f"  {label:<50}{value:>7.2f} s  {value / total:>6.1%}")
    return lines


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=DEMO["trainer.max_epochs"])
    parser.add_argument("--plain-epochs", type=int, default=3)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--sweep", nargs="+", metavar="DIR",
                        help="instead: the time split of a finished local sweep's trials (runs/ABLATION/PROFILE)")
    parser.add_argument("--trials", type=int, help="with --sweep: the first N finished trials of each folder")
    args, extra = parser.parse_known_args()
    if args.sweep:
        print("\n".join(sweep_split(args.sweep, args.trials)))
        return 0
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    import_start = CLOCK()
    from vit_lightning.commands.fit import main as train

    imports = CLOCK() - import_start
    instrument()
    with tempfile.TemporaryDirectory() as root:
        fit_start = CLOCK()
        train.main([*ARGV, f"--trainer.max_epochs={args.epochs}", f"--run.root={root}", *extra])
        trial = CLOCK() - fit_start + imports
    report(imports, trial, args.epochs)
    lightning_epoch = SECONDS["epochs (train + validation)"] / args.epochs
    for fused in (False, True) if args.plain_epochs else ():
        tr, va = plain_epochs(args.plain_epochs, fused)
        print(f"plain PyTorch loop ({'fused' if fused else 'unfused'} AdamW), one epoch: train {tr:.2f} s + "
              f"validation {va:.2f} s = {tr + va:.2f} s; the trial's epoch ({lightning_epoch:.2f} s) is "
              f"{lightning_epoch / (tr + va):.2f}x that")
    return 0


def report(imports: float, trial: float, epochs: int) -> None:
    s = SECONDS
    sanity = s["start-up: sanity validation"]
    validation = s["validation loops (incl. sanity)"] - sanity
    epochs_total = s["epochs (train + validation)"]
    train_loop = epochs_total - validation
    compute = s["model forward (train)"] + s["backward"] + s["optimizer update"] + s["gradient clipping"]
    rows = [
        ("imports", imports),
        ("options, data module, model, trainer", s["start-up: parse options, build data module, model, trainer"]),
        ("  of which: build the model", s["start-up: build the model"]),
        ("load the data", s["start-up: load the data"]),
        ("count GFLOPs", s["start-up: count GFLOPs"]),
        ("sanity validation", sanity),
        ("training, all epochs", train_loop),
        ("  forward + backward + clip + update", compute),
        ("  self.log calls", s["self.log (train)"]),
        ("  torchmetrics", s["torchmetrics (train)"]),
        ("  batch collate", s["batch collate"]),
        ("  the rest (Lightning loop, hooks)", train_loop - compute - sum(
            s[k] for k in ("self.log (train)", "torchmetrics (train)", "batch collate"))),
        ("validation, all epochs", validation),
        ("  of which model forward", s["model forward (eval)"] - s["start-up: count GFLOPs"]),
        ("  of which self.log and torchmetrics", s["self.log (eval)"] + s["torchmetrics (eval)"]),
        ("checkpointing", s["checkpointing"]),
        ("record writes", s["record writes"]),
        ("progress printing", s["progress printing"]),
    ]
    fit_parts = ("start-up: load the data", "start-up: count GFLOPs", "start-up: sanity validation",
                 "epochs (train + validation)", "checkpointing", "record writes", "progress printing")
    rows.append(("other Lightning set-up, teardown, hooks", s["fit (everything after the trainer exists)"] - sum(s[k] for k in fit_parts)))
    print(f"\n{'part':<42}{'seconds':>9}{'share':>8}")
    for name, sec in rows:
        print(f"{name:<42}{sec:>9.2f}{sec / trial:>8.1%}")
    print(f"{'whole trial':<42}{trial:>9.2f}{1:>8.1%}   ({epochs} epochs; per epoch: train {train_loop / epochs:.2f} s, "
          f"validation {validation / epochs:.2f} s)")


if __name__ == "__main__":
    sys.exit(main())
