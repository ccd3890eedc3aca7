"""`vit-ablate gpu-check`: one short, offline run that shows a GPU machine runs the GPU profiles (under 8 minutes).

Steps: the bench at ViT-B/16 224 px in bf16, eager and compiled, against timm, with the loaders of the GPU profiles
and whether 4 CPU workers feed B/16 when its JPEGs are decoded on the GPU; every encoding's and pooling's step time;
every encoding's step compiled at the cifar10 profile's S/4 32 px; the cifar10 profile's trial rate (real `fit`
trials on CIFAR-sized synthetic data, one alone and N on one GPU, the loss must fall and the records be complete)
and the projected time of the Table 8 cifar10 profile; a 1-GPU DDP fit with model.compile. Writes one markdown
report (for results/benchmarks.md); exits 1 if a step failed. `--dry-run` runs the same steps on the CPU at tiny
sizes, as CI does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from vit_lightning.ablation import load as load_ablation
from vit_lightning.commands.bench import cli as bench
from vit_lightning.commands.bench import loader, profile_run
from vit_lightning.commands.bench.models import DEFAULT_ENCODING
from vit_lightning.commands.bench.profile_run import FIT_COMMON, fit, rate_fit_args
from vit_lightning.commands.bench.report import render_markdown
from vit_lightning.commands.sweep.cli import positive
from vit_lightning.core.parser import CommandParser
from vit_lightning.data.glyphs import Glyphs
from vit_lightning.model import ENCODINGS

# The bench's arguments on the GPU and in the dry run (tiny sizes, one round, the CPU's own profile).
GPU_BENCH = ["--variant", "B", "--img-size", "224", "--patch-size", "16", "--batch-size", "128", "--steps", "10",
             "--rounds", "3", "--device", "cuda"]
# the cifar10 profile's model, batch and precision (ablation.BASE["cifar10"]), where short sequences make the
# attention biases and rotations elementwise-bound
GPU_PROFILE_BENCH = ["--variant", "S", "--img-size", "32", "--patch-size", "4", "--batch-size", "256", "--steps", "10",
                     "--rounds", "2", "--device", "cuda"]
DRY_BENCH = ["--variant", "micro", "--img-size", "16", "--patch-size", "8", "--batch-size", "2", "--steps", "1",
             "--rounds", "1", "--warmup", "1", "--device", "cpu", "--peak-size", "256", "--data-images", "32"]
# Dry run: inductor's C++ build of every graph takes minutes on a small CPU, so compiled runs trace through
# dynamo and AOTAutograd only (aot_eager); tests/test_compile.py runs inductor on the CPU.
DRY_COMPILE = ["--compile-backend", "aot_eager"]
DRY_ENCODINGS = [next(name for name, kind in ENCODINGS.items() if kind.rotary)]  # one rotation
FEED_WORKERS = 4  # the target: B/16 at 224 px fed at its step rate by at most 4 CPU workers (JPEGs decoded on
# the GPU); the dry run checks the same at the dry bench's size, on the CPU, from tiny JPEGs
DRY_JPEGS, DRY_JPEG_SIZE = 16, (64, 48)
TRIALS_PER_GPU = 3  # the trial-rate step's N (the sweep's --trials-per-gpu), unless --trials-per-gpu says otherwise

# Seconds each step is planned to take on one H200, from the rates measured there (torch 2.11, bf16): a B/16 step
# of 128 images ~50 ms eager; an S/4 step of 256 ~27 ms eager (9,476 img/s); compiling a model's training graph
# ~19 s (a cifar10 fit spent 76 s compiling about 4); a cifar10 trial ~8,500 img/s alone, ~15,000 for 3 together;
# a fit's start (imports, CUDA, data) ~15 s. The whole check is planned to stay under 8 minutes.
PLAN_S = {
    "headline": 90,  # 4 candidates x 32 steps x 50 ms, 2 compiles, 2 loaders and profile steps, FLOP counts
    "encodings": 40,  # 15 models eager x 32 steps x 50 ms, their FLOP counts
    "compiled encodings": 200,  # 10 encodings: 10 compiles x 19 s, their eager and compiled steps (~0.03 s each)
    "trial rate": 85,  # alone: 15 s + 3 x 50,000 / 8,500; 3 together: 15 s + 3 x 3 x 50,000 / 15,000; validation
    "ddp": 40,  # NCCL start, one micro compile, 40 steps
    "position benchmark": 25,  # a fit's start, 4,000 glyph images drawn at 224 px, 30 S/16 steps of 256
}
BUDGET_S = 8 * 60


def ddp_fit_args(dry: bool) -> dict:
    """A short DDP fit on one device: NCCL and model.compile on a GPU, gloo (eager) in the dry run."""
    return {**FIT_COMMON, "model.variant": "micro", "model.patch_size": 4, "data.batch_size": 64,
            "trainer.max_epochs": 1, "trainer.limit_train_batches": 4 if dry else 40, "trainer.limit_val_batches": 2,
            "trainer.strategy": "ddp", "trainer.accelerator": "cpu" if dry else "gpu",
            "trainer.precision": "bf16-mixed", "model.compile": not dry, "run.profile": "ddp"}


def diagnostic_fit_args(dry: bool) -> dict:
    """A short trial of pos_diagnostic's gpu profile (224 px glyph canvas, ViT-S/16, a rotary encoding, the relative
    task); in the dry run a micro ViT on a 48 px canvas, on the CPU."""
    prof = load_ablation("pos_diagnostic").profile("gpu")
    cell = next(c for c in prof.cells() if ENCODINGS[c["model.pos_encoding"]].rotary and c["data.task"] == "relative")
    settings = {**prof.fixed, **cell, **FIT_COMMON, "data.name": "glyphs", "trainer.max_epochs": 1,
                "trainer.limit_train_batches": 30, "trainer.limit_val_batches": 4, "run.profile": "gpu-check",
                "run.fewshot_shots": [], "run.shuffle_perms": 0, "seed_everything": 0}
    if dry:
        settings.update({"model.variant": "micro", "data.img_size": 48, "data.glyph_scale": 2, "model.patch_size": 8,
                         "data.batch_size": 16, "data.num_workers": 0, "trainer.accelerator": "cpu",
                         "trainer.precision": "32-true", "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1})
    return settings


def diagnostic_lines(record: dict, settings: dict) -> list[str]:
    """The trial's rate and the gpu profile's projected time on this GPU: trials x epochs x images / rate."""
    prof = load_ablation("pos_diagnostic").profile("gpu")
    trials, epochs, images = len(prof.trials()), prof.fixed["trainer.max_epochs"], Glyphs.size
    rate = record["compute"]["train_images_per_s"]
    hours = trials * epochs * images / rate / 3600
    return [*fit_summary(record), "",
            f"pos_diagnostic --profile gpu ({settings['model.pos_encoding']} on the {settings['data.task']} task here): "
            f"{trials} trials x {epochs} epochs x {images:,} images (training and validation) / {rate:,.0f} img/s "
            f"= {hours:.2f} h one trial at a time (each trial's start, about 15 s, not counted)"]


def fit_summary(record: dict) -> list[str]:
    c = record["compute"]
    losses = ", ".join(f"{h.get('train/loss', float('nan')):.3f}" for h in record["history"])
    compiled = f", compile {c['compile_s']:.0f} s" if c.get("compile_s") is not None else ""
    return [f"status {record['status']}, {c['num_devices']} device(s), precision {c['precision']}, "
            f"{c['train_images_per_s']:,.0f} train img/s, wall {c['wall_s']:.0f} s{compiled}",
            f"train/loss per epoch: {losses}; val/acc {record['metrics']['val/acc']:.3f}"]


def check_loss_falls(record: dict) -> None:
    first, last = record["history"][0]["train/loss"], record["history"][-1]["train/loss"]
    if not last < first:
        raise RuntimeError(f"train/loss did not fall: {first:.4f} -> {last:.4f}")


def run_bench(argv: list[str]) -> dict:
    args = bench.parser().parse_args(argv)
    args.argv = argv
    return bench.run(args)


def step_rate(report: dict) -> float | None:
    """The bench's eager bf16 img/s of ours with the default encoding and cls (the cifar10 profile's model)."""
    return next((r["images_per_s"] for r in report["models"] if r["name"] == f"ours {DEFAULT_ENCODING}/cls"
                 and r["precision"] == "bf16" and not r["compiled"]), None)


def option(argv: list[str], flag: str) -> str:
    """The value that follows `flag` in an argument list."""
    return argv[argv.index(flag) + 1]


def dry_folder_facts() -> loader.ProfileFacts:
    """The imagenet profile's loader at the dry bench's model, image side and batch, decoding on the device (the CPU)."""
    size, batch = int(option(DRY_BENCH, "--img-size")), int(option(DRY_BENCH, "--batch-size"))
    facts = loader.profile_facts("imagenet")
    return replace(facts, data={**facts.data, "img_size": size, "batch_size": batch, "decode_on": "device"},
                   variant=option(DRY_BENCH, "--variant"), patch_size=int(option(DRY_BENCH, "--patch-size")),
                   img_size=size, batch_size=batch)


def decode_feed(report: dict, dry: bool, tmp: Path) -> list[str]:
    """Whether the bench's model is fed by FEED_WORKERS workers that read bytes, its JPEGs decoded on the device: on
    a GPU from the imagenet profile's row of the bench; in the dry run measured the same way here, on the CPU."""
    row = next((d for d in report["data"] if d["profile"] == "imagenet"), None)
    if dry:
        facts, root = dry_folder_facts(), tmp / "jpegs"
        loader.write_jpegs(root, DRY_JPEGS, size=DRY_JPEG_SIZE)
        row = {"model": f"{facts.variant}/{facts.patch_size} {facts.img_size}px",
               **loader.folder_rates(facts, DRY_JPEGS, root, torch.device("cpu"), step_rate(report))}
    if row is None or row.get("device_decode_images_per_s") is None:
        where = "no imagenet row" if row is None else f"data.decode_on=auto decodes on the {row['decode_on']} here"
        return [f"JPEGs decoded on the device: not measured ({where}: torchvision's nvJPEG decode is not usable)"]
    fed, per_worker = row["step_images_per_s"], row["bytes_per_worker_images_per_s"]
    need = loader.workers_needed(fed, per_worker)
    return [f"{row['model']} fed with <= {FEED_WORKERS} workers, JPEGs decoded on the device: "
            f"{'yes' if need <= FEED_WORKERS else '**no**'} ({need} needed: {per_worker:,.0f} img/s per worker reading "
            f"bytes for a step of {fed:,.0f} img/s with the decode, which runs at {row['device_decode_images_per_s']:,.0f}"
            f" img/s on the device; a worker decoding in PIL: {row['per_worker_images_per_s']:,.0f} img/s)"]


def steps(dry: bool, tmp: Path, per_gpu: int = TRIALS_PER_GPU) -> list[tuple[str, Callable[[], list[str]]]]:
    """(title, function returning markdown lines) for every step of the check."""
    base = DRY_BENCH if dry else GPU_BENCH
    compiled = ["--compile", *(DRY_COMPILE if dry else [])]
    data = ["--profiles", "demo", "cifar10"] if dry else ["--profiles", "cifar10", "imagenet"]
    measured: dict[str, float | None] = {}

    def headline():
        report = run_bench([*base, "--precision", "bf16", *compiled, *data])
        return [render_markdown(report), "", *decode_feed(report, dry, tmp)]

    def encodings():
        return [render_markdown(run_bench([*base, "--precision", "bf16", "--encodings", "--no-timm", "--profiles"]))]

    def compiled_encodings():
        chosen = DRY_ENCODINGS if dry else []  # the dry run compiles one rotation; the GPU every encoding
        report = run_bench([*(DRY_BENCH if dry else GPU_PROFILE_BENCH), "--precision", "bf16", *compiled,
                            "--encodings", *chosen, "--no-poolings", "--no-timm", "--profiles"])
        measured["step"] = step_rate(report)
        return [render_markdown(report)]

    def trial_rate():
        alone = fit(rate_fit_args(dry), tmp / "alone" / "runs", timeout=300, dry=dry)
        check_loss_falls(alone)
        group = profile_run.together(per_gpu, tmp / "together", timeout=400, dry=dry)
        return [*fit_summary(alone), "", *profile_run.rate_lines(alone, group, measured.get("step"))]

    def ddp():
        return fit_summary(fit(ddp_fit_args(dry), tmp / "ddp" / "runs", timeout=240, dry=dry))

    def diagnostic():
        settings = diagnostic_fit_args(dry)
        return diagnostic_lines(fit(settings, tmp / "diagnostic" / "runs", timeout=240, dry=dry), settings)

    return [("Bench: ours vs timm, bf16, eager and compiled; the GPU profiles' loaders", headline),
            ("Every position encoding and pooling, bf16 eager", encodings),
            ("Every position encoding compiled, at the cifar10 profile's model and batch, bf16", compiled_encodings),
            (f"The cifar10 profile's trial rate on CIFAR-sized synthetic data: one trial alone, then {per_gpu} on one "
             "GPU; the projected Table 8 cifar10 profile", trial_rate),
            ("1-device DDP fit, bf16-mixed" + ("" if dry else ", model.compile"), ddp),
            ("The position benchmark's GPU profile (pos_diagnostic --profile gpu): one short trial, the profile's "
             "projected time", diagnostic)]


def main(argv: list[str]) -> int:
    p = CommandParser(prog="vit-ablate gpu-check", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes (CI)")
    p.add_argument("--out", default="gpu-check.md", help="the markdown report (default: gpu-check.md)")
    p.add_argument("--trials-per-gpu", type=positive, default=TRIALS_PER_GPU, metavar="N",
                   help=f"trials sharing the GPU in the trial-rate step (default {TRIALS_PER_GPU})")
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
    planned = f"planned {sum(PLAN_S.values())} s on one H200" if not args.dry_run else "tiny sizes on the CPU"
    lines, failed, start = [heading, "", f"({planned}.)", ""], [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        plan = steps(args.dry_run, Path(tmp), args.trials_per_gpu)
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
