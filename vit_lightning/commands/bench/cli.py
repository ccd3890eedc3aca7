"""`vit-ablate bench`: what a training step costs on this device, against timm and the device's matmul peak,
in fp32 / bf16, eager / compiled, for every position encoding and pooling; and whether each profile's loader keeps up."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from vit_lightning.commands.bench import loader, machine
from vit_lightning.commands.bench.models import (
    DEFAULT_ENCODING,
    PAIRED,
    candidates,
    ours,
    paired_family,
    subjects,
    train_flops_per_image,
)
from vit_lightning.commands.bench.report import render_text, targets
from vit_lightning.commands.bench.timing import (
    PRECISIONS,
    Candidate,
    matmul_peak,
    output_error,
    paired_ratio,
    run_round,
    sync,
    train_step,
)
from vit_lightning.compat.torch import allow_recompiles
from vit_lightning.core.parser import CommandParser
from vit_lightning.model import ENCODINGS, VARIANTS, ViT
from vit_lightning.model.position import NO_POSITION

SCHEMA = 1


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate bench", description=__doc__)
    p.add_argument("--variant", default="Ti", choices=list(VARIANTS))
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="timed steps per candidate per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds; every candidate is timed once per round, in turn")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate (the first compiles)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--precision", nargs="+", default=["32"], choices=PRECISIONS, help="32 and/or bf16 (autocast)")
    p.add_argument("--compile", action="store_true", help="also time every model under torch.compile")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no code generation)")
    p.add_argument("--encodings", nargs="*", metavar="NAME",
                   help="also every position encoding (its step time over none's) and pooling; names: those "
                        "encodings only (none is always among them)")
    p.add_argument("--no-poolings", action="store_true", help="with --encodings: the position encodings only")
    for arch, family in PAIRED.items():
        p.add_argument(f"--{arch}", default=None, choices=list(family.variants),
                       help=f"also our {family.cls.__name__} of this size against timm's at the same sizes (--img-size)")
    p.add_argument("--no-timm", action="store_true", help="skip the timm comparison")
    p.add_argument("--profiles", nargs="*", default=list(loader.PROFILES), choices=loader.PROFILES,
                   help="profiles whose data path is measured (none: skip the data path)")
    p.add_argument("--data-images", type=int, default=512, help="images read per profile to time its loader")
    p.add_argument("--peak-size", type=int, default=0, help="matmul side for the peak (0: 8192 on GPUs, 1024 on CPUs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    return p


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def measure_models(args, device: torch.device, modes: list[tuple[str, bool]], after_round) -> list[dict]:
    """Every subject in every mode, timed in alternating rounds (`after_round()` after each); one row per candidate."""
    torch.manual_seed(0)
    subs = subjects(args.variant, args.img_size, args.patch_size, chosen_encodings(args), not args.no_timm,
                    {arch: getattr(args, arch) for arch in PAIRED if getattr(args, arch)}, not args.no_poolings)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    y = torch.randint(0, 1000, (args.batch_size,), device=device)
    if any(compiled for _, compiled in modes):
        # Every compiled model is another entry in the same code objects' caches (ViT.forward, Block.forward).
        allow_recompiles(4 * len(subs) * len(modes))
    rows, cands = [], []
    for sub in subs:
        flops = train_flops_per_image(sub.model, 3, args.img_size, device)
        with torch.no_grad():
            ref = sub.model.to(device).train()(x).float()  # (B, K): the eager fp32 logits every mode must match
        for c in candidates(sub, modes, device, args.compile_backend):
            c.first_step_s, logits = _timed_first_step(c, x, y)
            c.match_error = output_error(logits, ref)
            for _ in range(args.warmup - 1):
                train_step(c, x, y)
            cands.append(c)
            rows.append({"name": sub.name, "kind": sub.kind, "pos_encoding": sub.pos_encoding, "pooling": sub.pooling,
                         "params": sum(p.numel() for p in sub.model.parameters()), "train_flop_per_image": flops,
                         "precision": c.precision, "compiled": c.compiled, "mode": c.mode})
        sub.model.cpu()
    # Mode by mode, so the candidates a ratio compares (ours and timm in one mode) run next to each other in time.
    order = sorted(range(len(cands)), key=lambda i: modes.index((cands[i].precision, cands[i].compiled)))
    rows, cands = [rows[i] for i in order], [cands[i] for i in order]
    for i in range(args.rounds):
        run_round(cands if i % 2 == 0 else cands[::-1], x, y, args.steps)  # ABBA: no candidate always goes first
        after_round()
    for row, c in zip(rows, cands):
        row.update(step_s=c.step_s, first_step_s=c.first_step_s, match_error=c.match_error,
                   match_tolerance=MATCH_TOLERANCE[c.precision])
        row["images_per_s"] = args.batch_size / statistics.median(c.step_s)
        row["flop_per_s"] = row["images_per_s"] * row["train_flop_per_image"]
    return rows


# Largest logit deviation from the eager fp32 model, in units of the logits' RMS: bf16 rounds at 2^-8
# relative and a 12-block network compounds it; fp32 under torch.compile only reorders sums.
MATCH_TOLERANCE = {"bf16": 0.1, "32": 1e-3}


def _timed_first_step(c: Candidate, x, y) -> tuple[float, torch.Tensor]:
    """Seconds of the first step (compilation included) and its logits, computed before any weight update."""
    sync(x.device)
    start = time.perf_counter()
    logits = train_step(c, x, y)
    sync(x.device)
    return time.perf_counter() - start, logits


def add_ratios(rows: list[dict]) -> None:
    """Paired per-round throughput ratios: vs timm and vs `none` (same mode), vs eager fp32 and vs eager (same model)."""
    def find(name: str, mode: str) -> dict | None:
        return next((r for r in rows if r["name"] == name and r["mode"] == mode), None)

    for r in rows:
        eager_mode = "fp32" if r["precision"] == "32" else "bf16"
        family = paired_family(r["name"])  # another family: against timm's model of that family
        reference = r["name"].replace("ours ", "timm ") if family else "timm"
        pairs = {"vs_timm": find(reference, r["mode"]), "vs_none": None if family else find("ours none/cls", r["mode"]),
                 "vs_fp32": find(r["name"], "fp32"), "vs_eager": find(r["name"], eager_mode)}
        for key, base in pairs.items():
            same = base is r or (key == "vs_timm" and r["kind"] == "timm")
            r[key] = None if base is None or same else paired_ratio(r["step_s"], base["step_s"])


def measure_profiles(args, device: torch.device) -> list[dict]:
    """Each profile's loader per CPU worker; on the profile's own kind of device, its step and the workers it needs
    (for an image folder decoded on that device: the step slowed by the decode, fed by workers that read bytes)."""
    out = []
    cores = machine.usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.profiles:
            facts = loader.profile_facts(name)
            root, folder = Path(tmp) / name, facts.data["name"] == "imagefolder"
            jpeg_kib = loader.write_jpegs(root, min(args.data_images, 256)) if folder else None
            mine = (device.type == "cuda") == (facts.accelerator == "gpu")  # a GPU profile's step means nothing on a CPU
            step = profile_step(facts, args, device) if mine else None
            row = {"profile": name, "dataset": facts.data["name"], "batch_size": facts.batch_size,
                   "model": f"{facts.variant}/{facts.patch_size} {facts.img_size}px", "precision": facts.precision,
                   "accelerator": facts.accelerator, "jpeg_kib": jpeg_kib, "workers_configured": facts.num_workers,
                   "bytes_per_worker_images_per_s": None, "decode_on": None, "device_decode_images_per_s": None,
                   "step_images_per_s": step, "workers_needed": None, "warning": None}
            if folder:
                row.update(loader.folder_rates(facts, args.data_images, root, device, step))
            else:
                row["per_worker_images_per_s"] = loader.loader_rate(facts, args.data_images, root)
            if step is not None:
                feeding = row["bytes_per_worker_images_per_s" if row["decode_on"] == "device" else "per_worker_images_per_s"]
                row.update(workers_needed=loader.workers_needed(row["step_images_per_s"], feeding),
                           warning=loader.feed_warning(facts, feeding, row["step_images_per_s"], cores))
            out.append(row)
    return out


def profile_step(facts: loader.ProfileFacts, args, device: torch.device) -> float:
    """Training images/s of the profile's model (ours, eager, the profile's precision and batch size)."""
    sub = ours(facts.variant, facts.img_size, facts.patch_size, in_chans=facts.in_chans, num_classes=facts.num_classes)
    [c] = candidates(sub, [(facts.precision, False)], device)
    x = torch.randn(facts.batch_size, facts.in_chans, facts.img_size, facts.img_size, device=device)
    y = torch.randint(0, facts.num_classes, (facts.batch_size,), device=device)
    for _ in range(max(1, args.warmup)):
        train_step(c, x, y)
    run_round([c], x, y, args.steps)
    return facts.batch_size / c.step_s[0]


def peak_flops(device: torch.device, size: int) -> dict[str, float]:
    """One short sample of the fp32 and bf16 matmul rates."""
    return {p: matmul_peak(device, dtype, size, min_s=0.1, repeats=2)
            for p, dtype in (("32", torch.float32), ("bf16", torch.bfloat16))}


def run(args) -> dict:
    """Measure everything the arguments ask for; the report as plain JSON-able values."""
    device = resolve_device(args.device)
    modes = [(p, False) for p in args.precision]
    no_compile = machine.compile_unavailable(device) if args.compile and args.compile_backend == "inductor" else None
    if args.compile and not no_compile:
        modes += [(p, True) for p in args.precision]
    size = args.peak_size or (8192 if device.type == "cuda" else 1024)
    report = {"schema": SCHEMA, "command": "vit-ablate bench " + " ".join(args.argv),
              "machine": machine.facts(device), "compile_unavailable": no_compile,
              "config": {"variant": args.variant, "img_size": args.img_size, "patch_size": args.patch_size,
                         "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds,
                         "precisions": args.precision, "compile": args.compile, "compile_backend": args.compile_backend,
                         "encodings": bool(chosen_encodings(args))},
              "peak_size": size}
    # Sampled before the models and after every round, the peak is the best sample: on a shared machine
    # one busy moment would lower it.
    peaks = [peak_flops(device, size)]
    rows = measure_models(args, device, modes, lambda: peaks.append(peak_flops(device, size)))
    report["peak_flop_per_s"] = {p: max(at[p] for at in peaks) for p in PRECISIONS}
    add_ratios(rows)
    for r in rows:
        r["peak_fraction"] = r["flop_per_s"] / report["peak_flop_per_s"][r["precision"]]
    report["models"] = rows
    report["data"] = measure_profiles(args, device)
    report["warnings"] = [d["warning"] for d in report["data"] if d["warning"]]
    report["warnings"] += [f"{r['name']} [{r['mode']}]: outputs differ from eager fp32 by {r['match_error']:.2g} "
                           f"x RMS (tolerance {r['match_tolerance']:g})" for r in rows if not _matches(r)]
    if no_compile:
        report["warnings"].append(f"torch.compile not measured: {no_compile}")
    report["targets"] = targets(report)
    report["machine"]["load_after"] = machine.load()
    return report


def _matches(row: dict) -> bool:
    return row["match_error"] <= row["match_tolerance"]


def check(args) -> None:
    """One-line errors for bad arguments, before anything is measured."""
    for name in ("img_size", "patch_size", "batch_size", "steps", "rounds", "warmup", "data_images"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    device = resolve_device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device is visible; use --device cpu")
    with torch.device("meta"):  # builds nothing in memory, but checks the sizes fit together
        for encoding in chosen_encodings(args) or [DEFAULT_ENCODING]:  # each encoding's own checks too
            ViT(args.variant, img_size=args.img_size, patch_size=args.patch_size, pos_encoding=encoding)


def chosen_encodings(args) -> list[str]:
    """The encodings --encodings asks for: [] without it, every one when it names none, else none and those named."""
    if args.encodings is None:
        return []
    unknown = [name for name in args.encodings if name not in ENCODINGS]
    if unknown:
        raise ValueError(f"--encodings {unknown[0]}: unknown; valid: {', '.join(ENCODINGS)}")
    return [e for e in ENCODINGS if not args.encodings or e in (NO_POSITION, DEFAULT_ENCODING, *args.encodings)]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    args.argv = list(argv)
    try:
        check(args)
    except (ValueError, RuntimeError) as error:
        print(f"vit-ablate bench: error: {error}", file=sys.stderr)
        return 2
    report = run(args)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(render_text(report))
    for line in report["warnings"]:
        print(f"warning: {line}", file=sys.stderr)
    return 0
