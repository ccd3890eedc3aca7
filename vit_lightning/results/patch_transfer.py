"""The patch_size ablation's transfer view: each trained patch size evaluated at every other one, no fine-tuning.

The numbers come from `vit-ablate eval RUN --model.patch_size=N --into-record` (the patch kernel PI-resized, the
position table resampled to the new grid), which stores top-1 in the record under `eval["<data>@<px>px/p<N>"]`; a
run at its own patch size reads its own `val/acc`. Rows: the trained patch size; columns: the evaluated one.
"""

from __future__ import annotations

from vit_lightning.results.render import Table
from vit_lightning.results.shapes import Data, fmt_acc
from vit_lightning.results.stats import summarize

PATCH = "model.patch_size"


def _accuracy(record: dict, patch: int) -> float | None:
    """A record's top-1 at `patch`: its own val/acc at its own patch size, else its eval at that patch size."""
    config = record.get("config") or {}
    if config.get(PATCH) == patch:
        return (record.get("metrics") or {}).get("val/acc")
    key = f"{config.get('data.name')}@{config.get('model.img_size')}px/p{patch}"
    return ((record.get("eval") or {}).get(key) or {}).get("val/acc")


def transfer_tables(data: Data) -> list[Table]:
    """The source x evaluated patch table (mean ± std over seeds) and the FlexiViT reference row; [] without evals."""
    ab = data.ablation
    sizes = sorted({c[PATCH] for c in data.profile.cells()})
    used = data.runs[data.runs["note"] == ""]
    grid = {}
    for source in sizes:
        names = used[used[PATCH] == source]["name"]
        for target in sizes:
            values = [v for v in (_accuracy(data.records.get(n, {}), target) for n in names) if v is not None]
            grid[source, target] = summarize(values)
    if not any(grid[s, t][2] for s in sizes for t in sizes if s != t):
        return []
    table = Table("Each trained patch size (rows) evaluated at every patch size (columns) without fine-tuning: "
                  "the patch kernel PI-resized, the position table resampled; top-1 on the validation set (bold: the "
                  "run's own patch size, its final val/acc)",
                  ["trained \\ evaluated", *map(str, sizes)], [])
    for i, source in enumerate(sizes):
        table.rows.append([str(source)] + [fmt_acc(*grid[source, t]) for t in sizes])
        table.bold.add((i, 1 + i))  # its own patch size
    tables = [table]
    if ab.patch_transfer_reference:
        ref = ab.patch_transfer_reference
        tables.append(Table(f"Reference: {ab.patch_transfer_note}", ["trained \\ evaluated", *map(str, ref)],
                            [[str(ab.patch_transfer_source), *(f"{v:.4f}" for v in ref.values())]]))
    return tables
