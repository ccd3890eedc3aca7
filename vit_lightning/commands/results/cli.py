"""`vit-ablate table ABLATION`: collect an ablation's run records and regenerate its tables and figures."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path

from vit_lightning.commands.results.derived import made_by, rebuild_derived
from vit_lightning.commands.results.further import stages
from vit_lightning.commands.results.tables import build, figure_runs, grid_draw, other_draw
from vit_lightning.core.parser import CommandParser
from vit_lightning.records.store import collect, fetch_wandb


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate table", description=__doc__.split(":", 1)[1].strip())
    p.add_argument("ablation", help="ablation name: a packaged one, or DIR/<name>.py with --ablations-dir DIR")
    p.add_argument("--ablations-dir", type=Path, metavar="DIR", help="also load ablations from DIR/<name>.py")
    p.add_argument("--profile", default="demo", help="which profile's runs to tabulate (default: demo)")
    p.add_argument("--runs", default="runs", help="local run root holding RUNS/ABLATION/PROFILE/*/results.json")
    p.add_argument("--out", default=None, help="output folder (default: results/ABLATION for the demo, "
                                               "results/ABLATION/PROFILE for another profile); records in OUT/records")
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
    p.add_argument("--replace", action="store_true",
                   help="replace stored finished records of other runs (the committed ones) with these runs' records, "
                        "and write over a table of another profile or metric in --out; each replaced record is named")
    p.add_argument("--no-figures", action="store_true",
                   help="skip the analysis figures (vit-ablate viz of one run per variant, from RUNS' checkpoints)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from vit_lightning import ablation as ablations

    try:
        ab = ablations.load(args.ablation, args.ablations_dir)
        if args.profile not in ab.profiles:
            raise ValueError(f"unknown profile {args.profile!r} for {ab.name}; choose from {', '.join(ab.profiles)}")
        flags = f" --metric {args.metric}" if args.metric and args.metric != ab.metric else ""
        ab = dataclasses.replace(ab, metric=args.metric) if args.metric else ab
        profile = ab.table_profile(args.profile)
        out = Path(args.out or default_out(ab.name, args.profile))
        check_owner(out, ab.name, args.profile, flags, args.replace)
        other = _other(ab, profile, args.compare_with)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"vit-ablate table: {e}", file=sys.stderr)
        return 2
    done = {}
    for name in [args.profile, *stages(ab, args.profile)]:  # the controls and selections its table reads, beside it
        done.update({(name, n): a for n, a in collect(Path(args.runs), ab.name, name, out / "records",
                                                      args.replace).items()})
    if args.wandb:
        try:
            fetched, skipped = fetch_wandb(args.wandb, ab.name, args.profile, out / "records", replace=args.replace)
        except Exception as e:  # no network, no API key, unknown sweep: one line, nothing half-built
            text = " ".join(str(e).split()) or type(e).__name__
            print(f"vit-ablate table: could not fetch W&B runs of {' '.join(args.wandb)}: {text[:300]}",
                  file=sys.stderr)
            return 2
        done.update({(args.profile, n): a for n, a in fetched.items()})
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        print(f"W&B: {len(fetched) + sum(skipped.values())} run(s) read, {len(fetched)} stored"
              + (f", {sum(skipped.values())} skipped ({why})" if skipped else ""), file=sys.stderr)
    paths = build(ab, profile, out, other, flags)
    if any(action != "kept" for action in done.values()):  # the tables built from these records elsewhere
        paths += rebuild_derived(ab, out, args.profile)
    for path in paths:
        print(path)
    if not args.no_figures:
        from vit_lightning.commands.viz import write_ablation_figures

        paths, notes = write_ablation_figures(ab, args.profile, Path(args.runs), out, figure_runs(ab, profile, out))
        for path in paths:
            print(path)
        for note in notes:
            print(f"vit-ablate table: {note}", file=sys.stderr)
    say_stored(done, out / "records")
    return 0


def default_out(ablation: str, profile: str) -> Path:
    """results/ABLATION for the demo, results/ABLATION/PROFILE for any other profile: a table and its records
    belong to one profile, so no profile's table is written over another's."""
    return Path("results") / ablation / ("" if profile == "demo" else profile)


def _other(ab, profile, compare_with: str | None):
    """The draw a table is shown beside: a searched profile's grid, or --compare-with's other draw; None."""
    if profile.search:
        return grid_draw(ab, profile, compare_with or Path("results") / ab.name)
    return other_draw(ab, profile, compare_with) if compare_with else None


def check_owner(out: Path, ablation: str, profile: str, flags: str, replace: bool) -> None:
    """ValueError (one line) when out holds the table of another profile or metric and --replace was not given."""
    made = made_by(out)
    if made is None or replace or (made[0], made[1], made[2].get("--metric", "")) == (
            ablation, profile, flags.removeprefix(" --metric ")):
        return
    raise ValueError(f"{out} holds the table of `vit-ablate table {made[0]} --profile {made[1]}"
                     f"{''.join(f' {k} {v}' for k, v in made[2].items())}`; give another --out ("
                     + (f"a folder of its own, e.g. {out / 'fewshot5'}" if flags else
                        f"the {profile} table's own folder is {default_out(ablation, profile)}")
                     + "), or --replace to write over that table (its records stay)")


def say_stored(done: dict[tuple[str, str], str], records: Path) -> None:
    """One line per record added, updated or replaced ((profile, trial) -> what happened), and what was kept
    (another run's finished record)."""
    for (profile, name), action in sorted(done.items()):
        if action != "kept":
            print(f"vit-ablate table: {action} the {profile} record {name} in {records}", file=sys.stderr)
    kept = sorted(name for (_, name), action in done.items() if action == "kept")
    if kept:
        print(f"vit-ablate table: kept {len(kept)} finished record(s) of other runs in {records} ({', '.join(kept[:3])}"
              f"{', ...' if len(kept) > 3 else ''}): these runs' records are not tabulated; --replace replaces them",
              file=sys.stderr)
    counts = Counter(done.values())
    print(f"{sum(n for a, n in counts.items() if a != 'kept')} new or updated record(s) in {records}"
          + "".join(f", {n} {a}" for a, n in sorted(counts.items())), file=sys.stderr)
