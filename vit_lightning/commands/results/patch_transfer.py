"""The patch_size ablation's transfer view: each trained patch size evaluated at every other one, no fine-tuning.

The numbers come from `vit-ablate eval RUN --model.patch_size=N --into-record` (the patch kernel PI-resized, the
position table resampled to the new grid), which stores top-1 in the record under `eval["<data>@<px>px/native/p<N>"]`; a
run at its own patch size reads its own `val/acc`. Rows: the trained patch size; columns: the evaluated one. Its
control rows read `vit-ablate eval RUN --model.patch_size=N --data.img_size=S --into-record` with S the trained grid's
side times N (`eval["<data>@<S>px/both/p<N>"]`, `/zoom/p<N>` before the views were named): image and patch scaled
together, the grid kept (keys of before, without the view, read the same: evalkey.py).
"""

from __future__ import annotations

from vit_lightning.core.evalkey import parse
from vit_lightning.records.render import Table
from vit_lightning.records.shapes import Data, fmt_acc
from vit_lightning.records.stats import summarize

PATCH = "model.patch_size"
# the control rows: image and patch scaled together, so the token grid is the trained one and PI-resize's guarantee
# (the same tokens at another scale) holds; what the plain rows lose beyond them is the new grid's
CONTROL_NOTE = ("control rows ('grid kept'): the same runs evaluated with the image resized with the patch (to the "
                "trained grid's side times the evaluated patch size, px), so the token grid stays the trained one")
CONTROL_COMMAND = "vit-ablate eval RUN --model.patch_size=P --data.img_size=S --into-record, S = the trained grid's side x P"


def same_grid_size(record: dict, patch: int) -> int | None:
    """The image size (px) at which `patch` gives the record's trained token grid, None when it cannot be read."""
    config = record.get("config") or {}
    size, own = config.get("model.img_size"), config.get(PATCH)
    return size // own * patch if isinstance(size, int) and isinstance(own, int) and own else None


def _accuracy(record: dict, patch: int, same_grid: bool = False) -> float | None:
    """A record's top-1 at `patch`: its own val/acc at its own patch size, else its eval at that patch size, at the
    trained image size or (same_grid) at the size that keeps the trained token grid."""
    config = record.get("config") or {}
    if config.get(PATCH) == patch:
        return (record.get("metrics") or {}).get("val/acc")
    size = same_grid_size(record, patch) if same_grid else config.get("model.img_size")
    for name, metrics in (record.get("eval") or {}).items():
        key = parse(name)  # the run's own data at that size and patch, the images as trained or resized
        if key and key.patch == patch and key.img_size == size and key.view in ("native", "both") and key.of_run(config):
            return (metrics or {}).get("val/acc")
    return None


def transfer_tables(data: Data) -> list[Table]:
    """The source x evaluated patch table (mean ± std over seeds) with its same-grid control rows, and the FlexiViT
    reference row; [] without evals."""
    ab = data.ablation
    sizes = sorted({c[PATCH] for c in data.profile.cells()})
    used = data.runs[data.runs["note"] == ""]
    grid, control = {}, {}
    for source in sizes:
        records = [data.records.get(n, {}) for n in used[used[PATCH] == source]["name"]]
        for target in sizes:
            for same, into in ((False, grid), (True, control)):
                into[source, target] = summarize([v for v in (_accuracy(r, target, same) for r in records)
                                                  if v is not None])
    if not any(grid[s, t][2] for s in sizes for t in sizes if s != t):
        return []
    controlled = any(control[s, t][2] for s in sizes for t in sizes if s != t)
    table = Table("Each trained patch size (rows) evaluated at every patch size (columns) without fine-tuning: "
                  "the patch kernel PI-resized, the position table resampled; top-1 on the validation set (bold: the "
                  "run's own patch size, its final val/acc); " + CONTROL_NOTE
                  + ("" if controlled else f" (none evaluated yet: {CONTROL_COMMAND})"),
                  ["trained \\ evaluated", *map(str, sizes)], [])
    for i, source in enumerate(sizes):
        table.rows.append([str(source)] + [fmt_acc(*grid[source, t]) for t in sizes])
        table.bold.add((i, 1 + i))  # its own patch size
    for i, source in enumerate(sizes if controlled else []):
        table.rows.append([f"{source}, grid kept"] + [fmt_acc(*control[source, t]) for t in sizes])
        table.bold.add((len(sizes) + i, 1 + i))
    tables = [table]
    if ab.patch_transfer_reference:
        ref = ab.patch_transfer_reference
        tables.append(Table(f"Reference: {ab.patch_transfer_note}", ["trained \\ evaluated", *map(str, ref)],
                            [[str(ab.patch_transfer_source), *(f"{v:.4f}" for v in ref.values())]]))
    return tables
