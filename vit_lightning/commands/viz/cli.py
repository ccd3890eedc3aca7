"""`vit-ablate viz RUN_DIR_OR_CHECKPOINT`: draw the paper's analysis figures for one trained run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit_lightning.commands.viz import analysis
from vit_lightning.commands.viz.run import VizError, artifact_metrics, compute, draw, load_run, log_to_wandb
from vit_lightning.core.names import RECORD
from vit_lightning.core.parser import CommandParser
from vit_lightning.run.rundir import Busy, RunDirError, checkpoint_path, update_record


def parser() -> CommandParser:
    p = CommandParser(
        prog="vit-ablate viz",
        description="Position-embedding similarity (or relative bias), mean attention distance per head, "
        "attention rollout and the patch filters' principal components of one run, as PNGs with CSVs.",
    )
    p.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT", help="a run dir holding last.ckpt, or a .ckpt file")
    p.add_argument("--out", default=None, help="output folder (default: viz/ beside the checkpoint)")
    p.add_argument("--images", type=_count, default=32,
                   help="validation images to average attention over (default 32; 0: weight figures only)")
    p.add_argument("--into-record", action="store_true",
                   help="also add the artifact numbers (high-norm token fraction, attention entropy per layer) to the "
                        "run's results.json, where the registers table reads them")
    p.add_argument("--wandb", choices=("auto", "off"), default="auto",
                   help="auto: also log the PNGs to the run's W&B run when its record names one")
    return p


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def into_record(run, numbers) -> str:
    """Add the artifact numbers to the run's results.json (under the run dir's lock); a line saying what was done."""
    if getattr(numbers, "high_norm", None) is None:
        return "--into-record: nothing added (no attention numbers: a family without them, or --images 0)"

    def add(record: dict) -> None:
        record.setdefault("metrics", {}).update(artifact_metrics(numbers))
        record["viz"] = {"images": len(run.images), "high_norm_factor": analysis.HIGH_NORM,
                         "high_norm": numbers.high_norm.tolist(), "attn_entropy": numbers.entropy.tolist()}

    try:
        update_record(run.directory, add)
    except (Busy, RunDirError) as error:
        return f"--into-record: nothing added ({error})"
    return f"updated {run.directory / RECORD}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        run = load_run(Path(args.run), args.images)
    except VizError as error:
        print(f"vit-ablate viz: error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else checkpoint_path(Path(args.run)).parent / "viz"
    numbers = compute(run)
    paths = draw(numbers, out)
    for path in paths:
        print(f"note: {path.read_text().strip()} ({path})" if path.suffix == ".txt" else path)
    if args.into_record:
        print(into_record(run, numbers), file=sys.stderr)
    said = log_to_wandb(run, paths) if args.wandb == "auto" else None
    if said:
        print(said, file=sys.stderr)
    return 0
