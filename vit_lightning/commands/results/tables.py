"""The files of one ablation's results: records -> runs.csv, table.md, table.tex and figures, by its layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from vit_lightning.commands.results.further import stages
from vit_lightning.commands.results.layouts import BUILDERS
from vit_lightning.commands.results.searched import build_search
from vit_lightning.commands.results.settle import ceiling_tables, curve_figure, settling_table
from vit_lightning.core.files import write_atomic
from vit_lightning.records.frame import cell_frame, design_cells, runs_frame, standing_runs
from vit_lightning.records.render import to_latex, to_markdown
from vit_lightning.records.shapes import Data
from vit_lightning.records.store import load_records


def build(ablation: Any, profile: Any, out: Path, other: OtherDraw | None = None, flags: str = "") -> list[Path]:
    """Regenerate runs.csv, table.md, table.tex and figures in out from out/records; the paths written.

    other: another draw of the same design (see `other_draw`), whose verdicts the table shows beside its own;
    flags: the command's further flags, named in the table's header (` --metric M`).
    """
    out = Path(out)
    records = own_records(ablation, profile, load_records(out / "records"))
    runs = runs_frame(ablation, profile, records)
    cells = cell_frame(ablation, profile, runs)
    data = Data(ablation, profile, runs, cells, {r["name"]: r.get("history") or [] for r in records},
                records={r["name"]: r for r in records}, flags=flags)
    if other is not None:
        their = runs_frame(ablation, other.profile, other.records)
        data.other = Data(ablation, other.profile, their, cell_frame(ablation, other.profile, their),
                          {r["name"]: r.get("history") or [] for r in other.records})
        data.other_source = other.source
    rep = build_search(data) if profile.search else BUILDERS[ablation.layout](data)
    if getattr(profile, "settle", False):
        rep.tables += [settling_table(data), *ceiling_tables(profile)]
        rep.figures.append(curve_figure(data))
    csv = runs.drop(columns=["cell", "time"])
    for col in ("seed", "params"):  # keep integers integral even when some runs lack them
        csv[col] = pd.to_numeric(csv[col], errors="coerce").round().astype("Int64")
    files = {"runs.csv": csv.to_csv(index=False, float_format="%.6g", lineterminator="\n"),
             "table.md": to_markdown(rep), "table.tex": to_latex(rep)}
    for name, text in files.items():
        write_atomic(out / name, text.encode())
    for png, _, draw in rep.figures:
        draw(out / png)
    return [out / name for name in files] + [out / png for png, _, _ in rep.figures]


def own_records(ablation: Any, profile: Any, records: list[dict]) -> list[dict]:
    """The records a profile's table reads: its own and its stages' (a folder may hold other profiles' records of
    the same trial names, each in a file of its own)."""
    mine = {profile.name, *stages(ablation, profile.name)}
    return [r for r in records if r.get("profile") in mine and r.get("ablation", ablation.name) == ablation.name]


class OtherDraw(NamedTuple):
    """Another draw of one design: the records of a profile with the same cells (other seeds), and where from."""

    source: str
    profile: Any
    records: list[dict]


def other_draw(ablation: Any, profile: Any, folder: str) -> OtherDraw:
    """The records in folder/records as another draw of profile's design; ValueError (one line) if they are not."""
    where = f"--compare-with {folder}"
    if ablation.baseline is None or ablation.layout not in ("grid", "compute"):
        raise ValueError(f"{where}: it compares verdicts against a baseline, and {ablation.name} "
                         f"(layout {ablation.layout!r}) declares none; ablations with one: a grid or compute layout "
                         f"and `baseline=`")
    records = [r for r in load_records(Path(folder) / "records") if r.get("ablation", ablation.name) == ablation.name]
    names = sorted({str(r.get("profile")) for r in records})
    if len(names) != 1:
        found = f"records of profiles {', '.join(names)}" if names else f"no {ablation.name} records"
        raise ValueError(f"{where}: expected the records of one profile in {Path(folder) / 'records'}, found {found}")
    if names[0] not in ablation.profiles:
        raise ValueError(f"{where}: its records are of profile {names[0]!r}, which {ablation.name} does not have; "
                         f"choose from {', '.join(ablation.profiles)}")
    theirs = ablation.table_profile(names[0])
    if design_cells(theirs) != design_cells(profile) or names[0] == profile.name:
        why = "is this profile" if names[0] == profile.name else "has other cells"
        raise ValueError(f"{where}: its profile {names[0]!r} {why}; compare two draws of one design "
                         f"(profiles with the same cells and other seeds)")
    return OtherDraw(folder, theirs, records)


def grid_draw(ablation: Any, profile: Any, folder: str | Path) -> OtherDraw:
    """The records of the grid a searched profile is measured against (its search's `grid` profile) in
    folder/records; ValueError (one line) when there are none."""
    grid = ablation.table_profile(profile.search["grid"])
    records = [r for r in load_records(Path(folder) / "records")
               if r.get("profile") == grid.name and r.get("ablation", ablation.name) == ablation.name]
    if not records:
        raise ValueError(f"no records of the {ablation.name} {grid.name} grid in {Path(folder) / 'records'}, which "
                         f"the {profile.name} table measures its search against: give --compare-with DIR")
    return OtherDraw(str(folder), grid, records)


def figure_runs(ablation: Any, profile: Any, out: Path) -> list[list[str]]:
    """Per designed cell, the names of the runs out/records' table uses for it (see frame.standing_runs)."""
    records = own_records(ablation, profile, load_records(Path(out) / "records", quiet=True))  # build() said it
    runs = runs_frame(ablation, profile, records)
    return standing_runs(runs, len(design_cells(profile)))
