"""`vit-ablate table ABLATION`: collect an ablation's run records and regenerate its tables and figures."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from vit_lightning.commands.results.further import stages
from vit_lightning.commands.results.tables import build, figure_runs, grid_draw, other_draw
from vit_lightning.records.store import collect, fetch_wandb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vit-ablate table", description=__doc__.split(":", 1)[1].strip())
    p.add_argument("ablation", help="ablation name: a packaged one, or DIR/<name>.py with --ablations-dir DIR")
    p.add_argument("--ablations-dir", type=Path, metavar="DIR", help="also load ablations from DIR/<name>.py")
    p.add_argument("--profile", default="demo", help="which profile's runs to tabulate (default: demo)")
    p.add_argument("--runs", default="runs", help="local run root holding RUNS/ABLATION/PROFILE/*/results.json")
    p.add_argument("--out", default=None, help="output folder (default: results/ABLATION); records in OUT/records")
    p.add_argument("--wandb", nargs="+", metavar="PATH",
                   help="also fetch W&B runs: ENTITY/PROJECT/SWEEP_ID (a sweep; several allowed), or ENTITY/PROJECT "
                        "(every run tagged with the ablation); a finished run's own record is never replaced by its "
                        "W&B copy")
    p.add_argument("--metric", default=None,
                   help="record metric to tabulate instead of the ablation's own, e.g. val/fewshot5 (the paper's)")
    p.add_argument("--compare-with", metavar="DIR",
                   help="another draw of the same design (DIR/records: a profile with the same cells, other seeds, "
                        "e.g. results/pos_encoding): adds both draws' verdicts against the baseline, cell by cell; for a "
                        "searched profile (cls_vs_gap demo_bayes), the folder of the grid it is measured against "
                        "(default results/ABLATION)")
    p.add_argument("--no-figures", action="store_true",
                   help="skip the analysis figures (vit-ablate viz of one run per variant, from RUNS' checkpoints)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from vit_lightning import ablation as ablations

    try:
        ab = ablations.load(args.ablation, args.ablations_dir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"vit-ablate table: {e}", file=sys.stderr)
        return 2
    if args.profile not in ab.profiles:
        print(f"vit-ablate table: unknown profile {args.profile!r} for {ab.name}; "
              f"choose from {', '.join(ab.profiles)}", file=sys.stderr)
        return 2
    if args.metric:
        ab = dataclasses.replace(ab, metric=args.metric)
    searched = ab.table_profile(args.profile).search
    # a searched profile's table sits beside its grid's, which it reads (results/<ablation>/records by default)
    out = Path(args.out or Path("results") / ab.name / (args.profile if searched else ""))
    other = None
    if searched:
        try:
            other = grid_draw(ab, ab.table_profile(args.profile), args.compare_with or Path("results") / ab.name)
        except ValueError as e:
            print(f"vit-ablate table: {e}", file=sys.stderr)
            return 2
    elif args.compare_with:
        try:
            other = other_draw(ab, ab.table_profile(args.profile), args.compare_with)
        except ValueError as e:
            print(f"vit-ablate table: {e}", file=sys.stderr)
            return 2
    new = collect(Path(args.runs), ab.name, args.profile, out / "records")
    for stage in stages(ab, args.profile):  # the controls and selections its table reads, beside its records
        new += collect(Path(args.runs), ab.name, stage, out / "records")
    if args.wandb:
        try:
            fetched, skipped = fetch_wandb(args.wandb, ab.name, args.profile, out / "records")
        except Exception as e:  # no network, no API key, unknown sweep: one line, nothing half-built
            text = " ".join(str(e).split()) or type(e).__name__
            print(f"vit-ablate table: could not fetch W&B runs of {' '.join(args.wandb)}: {text[:300]}",
                  file=sys.stderr)
            return 2
        new += fetched
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        print(f"W&B: {len(fetched) + sum(skipped.values())} run(s) read, {len(fetched)} stored"
              + (f", {sum(skipped.values())} skipped ({why})" if skipped else ""), file=sys.stderr)
    for path in build(ab, ab.table_profile(args.profile), out, other):
        print(path)
    if not args.no_figures:
        from vit_lightning.commands.viz import write_ablation_figures

        profile = ab.table_profile(args.profile)
        paths, notes = write_ablation_figures(ab, args.profile, Path(args.runs), out, figure_runs(ab, profile, out))
        for path in paths:
            print(path)
        for note in notes:
            print(f"vit-ablate table: {note}", file=sys.stderr)
    print(f"{len(new)} new or updated record(s) in {out / 'records'}", file=sys.stderr)
    return 0
