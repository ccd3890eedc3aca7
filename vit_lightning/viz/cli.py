"""`vit-ablate viz RUN_DIR_OR_CHECKPOINT`: draw the paper's analysis figures for one trained run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit_lightning.rundir import checkpoint_path
from vit_lightning.viz.run import VizError, compute, draw, load_run, log_to_wandb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-ablate viz",
        description="Position-embedding similarity (or relative bias), mean attention distance per head, "
        "attention rollout and the patch filters' principal components of one run, as PNGs with CSVs.",
    )
    p.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT", help="a run dir holding last.ckpt, or a .ckpt file")
    p.add_argument("--out", default=None, help="output folder (default: viz/ beside the checkpoint)")
    p.add_argument("--images", type=_count, default=32,
                   help="validation images to average attention over (default 32; 0: weight figures only)")
    p.add_argument("--wandb", choices=("auto", "off"), default="auto",
                   help="auto: also log the PNGs to the run's W&B run when its record names one")
    return p


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        run = load_run(Path(args.run), args.images)
    except VizError as error:
        print(f"vit-ablate viz: error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else checkpoint_path(Path(args.run)).parent / "viz"
    paths = draw(compute(run), out)
    for path in paths:
        print(f"note: {path.read_text().strip()} ({path})" if path.suffix == ".txt" else path)
    said = log_to_wandb(run, paths) if args.wandb == "auto" else None
    if said:
        print(said, file=sys.stderr)
    return 0
