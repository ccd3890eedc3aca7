"""A grid table's further columns: a metric minus a reference cell's, a control profile's accuracy."""

from __future__ import annotations

import pandas as pd

from vit_lightning.ablation import selector
from vit_lightning.records.frame import cell_frame, runs_frame
from vit_lightning.records.shapes import Data, cell_name, measured, value_key

OFFSET, CONTROL = "offset:", "control:"  # prefixes of the derived columns in the cell frame


def columns(data: Data) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the cells with every further column as (mean, std, n), column key -> title), `columns` first."""
    ab, cells = data.ablation, data.cells.copy()
    extra = measured(ab.columns, cells)
    keys = list(data.profile.axes)
    for metric, (title, ref) in ab.offsets.items():
        hits = [i for i, c in cells.iterrows() if all(value_key(c.get(k)) == value_key(v) for k, v in ref.items())]
        if not hits or metric not in cells:  # a profile without the reference cell: no such column
            continue
        base = cells.at[hits[0], metric][0]
        cells[OFFSET + metric] = [(m - base, s, n) for m, s, n in cells[metric]]
        extra[OFFSET + metric] = title
    for suffix, title in ab.controls.items():
        if data.profile.name + suffix not in ab.profiles:
            continue
        theirs = _control(data, data.profile.name + suffix)
        cells[CONTROL + suffix] = [theirs.get(cell_name(c, keys), (float("nan"), float("nan"), 0))
                                   for _, c in cells.iterrows()]
        extra[CONTROL + suffix] = title
    return cells, extra


def _control(data: Data, name: str) -> dict[str, tuple[float, float, int]]:
    """The control profile's (mean, std, n) per cell name, from the same records folder."""
    prof = data.ablation.table_profile(name)
    mine = cell_frame(data.ablation, prof, runs_frame(data.ablation, prof, list(data.records.values())))
    keys = list(prof.axes)
    return {cell_name(c, keys): (c["mean"], c["std"], c["n"]) for _, c in mine.iterrows()}


def stages(ablation, profile: str) -> list[str]:
    """The other profiles a profile's table reads: its controls and the stages that select its settings."""
    prof = ablation.profile(profile)
    controls = [profile + suffix for suffix in ablation.controls if profile + suffix in ablation.profiles]
    return controls + [name for v in prof.fixed.values() if (name := selector(v)) and name in ablation.profiles]
