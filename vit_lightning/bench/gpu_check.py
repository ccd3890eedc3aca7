"""`vit-ablate gpu-check`: one short, offline run that shows a GPU machine runs the GPU profiles (under 8 minutes).

Steps: the bench at ViT-B/16 224 px in bf16, eager and compiled, against timm, with the loaders of the GPU
profiles; every encoding's and pooling's step time; a 2-epoch fit of the cifar10 profile on synthetic
CIFAR-shaped data in bf16-mixed (the loss must fall, the record must be complete); a 1-GPU DDP fit with
model.compile. Writes one markdown report (for results/benchmarks.md); exits 1 if a step failed.
`--dry-run` runs the same steps on the CPU at tiny sizes, as CI does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

import vit_lightning
from vit_lightning.ablation import BASE
from vit_lightning.bench import cli as bench
from vit_lightning.bench.report import render_markdown
from vit_lightning.run.rundir import read_record, run_dirs

# The bench's arguments on the GPU and in the dry run (tiny sizes, one round, the CPU's own profile).
GPU_BENCH = ["--variant", "B", "--img-size", "224", "--patch-size", "16", "--batch-size", "128", "--steps", "10",
             "--rounds", "3", "--device", "cuda"]
DRY_BENCH = ["--variant", "micro", "--img-size", "16", "--patch-size", "8", "--batch-size", "2", "--steps", "1",
             "--rounds", "1", "--warmup", "1", "--device", "cpu", "--peak-size", "256", "--data-images", "32"]
# Dry run: inductor's C++ build of every graph takes minutes on a small CPU, so compiled runs trace through
# dynamo and AOTAutograd only (aot_eager); tests/test_compile.py runs inductor on the CPU.
DRY_COMPILE = ["--compile-backend", "aot_eager"]
FIT_COMMON = {"data.name": "synthetic", "data.download": False, "run.wandb": "off", "run.ablation": "gpu-check",
              "trainer.devices": 1, "trainer.enable_progress_bar": False}


def cifar10_fit_args(dry: bool) -> dict:
    """The cifar10 profile for 2 epochs on synthetic CIFAR-shaped data (dry: a micro ViT, 8 batches, 1 worker)."""
    settings = {**BASE["cifar10"], **FIT_COMMON, "trainer.max_epochs": 2, "run.profile": "cifar10"}
    if dry:
        settings.update({"model.variant": "micro", "model.patch_size": 8, "data.batch_size": 32, "data.num_workers": 1,
                         "trainer.accelerator": "cpu", "trainer.limit_train_batches": 8, "trainer.limit_val_batches": 1,
                         "model.warmup_epochs": 0, "model.lr": 0.003})
    return settings


def ddp_fit_args(dry: bool) -> dict:
    """A short DDP fit on one device: NCCL and model.compile on a GPU, gloo (eager) in the dry run."""
    return {**FIT_COMMON, "model.variant": "micro", "model.patch_size": 4, "data.batch_size": 64,
            "trainer.max_epochs": 1, "trainer.limit_train_batches": 4 if dry else 40, "trainer.limit_val_batches": 2,
            "trainer.strategy": "ddp", "trainer.accelerator": "cpu" if dry else "gpu",
            "trainer.precision": "bf16-mixed", "model.compile": not dry, "run.profile": "ddp"}


def fit(settings: dict, root: Path, timeout: int, dry: bool) -> dict:
    """Run `vit-ablate fit` in a fresh process, as a sweep trial does; its record, checked to be complete."""
    argv = [f"--{k}={json.dumps(v) if isinstance(v, (bool, list)) else v}" for k, v in settings.items()]
    package_root = str(Path(vit_lightning.__file__).resolve().parents[1])
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    if dry:
        env["OMP_NUM_THREADS"] = "1"  # tiny sizes gain nothing from threads, which stall on a busy CI machine
    command = [sys.executable, "-m", "vit_lightning.cli", "fit", *argv, f"--run.root={root}"]
    root.mkdir(parents=True)
    done = subprocess.run(command, cwd=root.parent, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"fit exited {done.returncode}; the end of its stderr:\n{tail}")
    [directory] = [run for folder in root.glob("*/*") for run in run_dirs(folder)]
    record = read_record(directory) or {}
    history = record.get("history") or []
    if record.get("status") != "completed" or len(history) != settings["trainer.max_epochs"]:
        raise RuntimeError(f"record incomplete: status {record.get('status')}, {len(history)} epochs: {record.get('error')}")
    missing = [k for k in ("params", "gflops_per_image", "train_images_per_s", "wall_s") if record["compute"].get(k) is None]
    if missing or "val/acc" not in record["metrics"]:
        raise RuntimeError(f"record incomplete: compute lacks {missing} or metrics lack val/acc")
    return record


def fit_summary(record: dict) -> list[str]:
    c = record["compute"]
    losses = ", ".join(f"{h.get('train/loss', float('nan')):.3f}" for h in record["history"])
    return [f"status {record['status']}, {c['num_devices']} device(s), precision {c['precision']}, "
            f"{c['train_images_per_s']:,.0f} train img/s, wall {c['wall_s']:.0f} s",
            f"train/loss per epoch: {losses}; val/acc {record['metrics']['val/acc']:.3f}"]


def check_loss_falls(record: dict) -> None:
    first, last = record["history"][0]["train/loss"], record["history"][-1]["train/loss"]
    if not last < first:
        raise RuntimeError(f"train/loss did not fall: {first:.4f} -> {last:.4f}")


def run_bench(argv: list[str]) -> dict:
    args = bench.parser().parse_args(argv)
    args.argv = argv
    return bench.run(args)


def steps(dry: bool, tmp: Path) -> list[tuple[str, Callable[[], list[str]]]]:
    """(title, function returning markdown lines) for every step of the check."""
    base = DRY_BENCH if dry else GPU_BENCH
    compiled = ["--compile", *(DRY_COMPILE if dry else [])]
    data = ["--profiles", "demo", "cifar10"] if dry else ["--profiles", "cifar10", "imagenet"]

    def headline():
        return [render_markdown(run_bench([*base, "--precision", "bf16", *compiled, *data]))]

    def encodings():
        return [render_markdown(run_bench([*base, "--precision", "bf16", "--encodings", "--no-timm", "--profiles"]))]

    def cifar10():
        record = fit(cifar10_fit_args(dry), tmp / "cifar10" / "runs", timeout=300, dry=dry)
        check_loss_falls(record)
        return fit_summary(record)

    def ddp():
        return fit_summary(fit(ddp_fit_args(dry), tmp / "ddp" / "runs", timeout=240, dry=dry))

    return [("Bench: ours vs timm, bf16, eager and compiled; the GPU profiles' loaders", headline),
            ("Every position encoding and pooling, bf16 eager", encodings),
            ("2-epoch fit of the cifar10 profile on synthetic CIFAR-shaped data, bf16-mixed", cifar10),
            ("1-device DDP fit, bf16-mixed" + ("" if dry else ", model.compile"), ddp)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vit-ablate gpu-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes (CI)")
    p.add_argument("--out", default="gpu-check.md", help="the markdown report (default: gpu-check.md)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("vit-ablate gpu-check: no CUDA device visible; run it on a GPU machine, or pass --dry-run", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if args.dry_run:
        torch.set_num_threads(1)  # as for the dry run's fits
    try:
        return _check(args)
    finally:
        torch.set_num_threads(threads)


def _check(args) -> int:
    """Run every step, writing the report after each; 1 if a step failed."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = "dry run on the CPU" if args.dry_run else torch.cuda.get_device_name(0)
    heading = f"## vit-ablate gpu-check{' --dry-run' if args.dry_run else ''}: {title}, {when}"
    lines, failed, start = [heading, ""], [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        plan = steps(args.dry_run, Path(tmp))
        for name, step in plan:
            began = time.time()
            print(f"gpu-check: {name} ...", flush=True)
            try:
                body, verdict = step(), "passed"
            except Exception as error:  # one failed step must not hide the others
                trace = "".join(traceback.format_exception(error)).splitlines()[-30:]
                body, verdict = [f"    {line}" for line in trace], "FAILED"
                failed.append(name)
            lines += [f"### {name}: {verdict} ({time.time() - began:.0f} s)", "", *body, ""]
            print(f"gpu-check: {name}: {verdict}", flush=True)
            Path(args.out).write_text("\n".join(lines))  # so far: a run stopped by a time limit still reports
    summary = f"**{len(failed)} of {len(plan)} steps failed**" if failed else "all steps passed"
    lines.insert(2, f"{summary}; {time.time() - start:.0f} s in all.\n")
    Path(args.out).write_text("\n".join(lines))
    print(f"gpu-check: {summary}; report: {args.out}")
    return 1 if failed else 0
