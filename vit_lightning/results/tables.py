"""The files of one ablation's results: records -> runs.csv, table.md, table.tex and figures, by its layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from vit_lightning.bookkeeping import write_atomic
from vit_lightning.results.frame import cell_frame, design_cells, runs_frame, standing_runs
from vit_lightning.results.layouts import BUILDERS
from vit_lightning.results.render import to_latex, to_markdown
from vit_lightning.results.shapes import Data
from vit_lightning.results.store import load_records


def build(ablation: Any, profile: Any, out: Path) -> list[Path]:
    """Regenerate runs.csv, table.md, table.tex and figures in out from out/records; the paths written."""
    out = Path(out)
    records = load_records(out / "records")
    runs = runs_frame(ablation, profile, records)
    cells = cell_frame(ablation, profile, runs)
    data = Data(ablation, profile, runs, cells, {r["name"]: r.get("history") or [] for r in records})
    rep = BUILDERS[ablation.layout](data)
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


def figure_runs(ablation: Any, profile: Any, out: Path) -> list[list[str]]:
    """Per designed cell, the names of the runs out/records' table uses for it (see frame.standing_runs)."""
    runs = runs_frame(ablation, profile, load_records(Path(out) / "records"))
    return standing_runs(runs, len(design_cells(profile)))
