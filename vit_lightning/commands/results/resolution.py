"""The resolution view: each run evaluated at other image sizes without fine-tuning, beside its own size.

`vit-ablate eval RUN --data.img_size=N --into-record` stores top-1 in the run record under `eval["<data>@<N>px/zoom"]`
when the images were resized to N (content zoom: a patch holds more or less of the image), or `"<data>@<N>px/canvas"`
when the content kept its scale on a canvas of N (padded, or drawn there: more tokens, the same patches); data that
asks several questions names its task and glyph scale (`glyphs:relative:x1@48px/canvas`), and only the run's own
are this view's (evalkey.py; keys of before, `<data>@<N>px[/canvas]`, read as the run's own). The record's
`pos_resize` says how the encoding met the new grid; the size a run was trained at reads its own `val/acc`. Rows:
the cells; columns: the image sizes and how each was reached. Only a larger canvas asks an encoding to extrapolate
with the patches it knows (RoPE-ViT's test); a zoom also changes what each patch holds.
"""

from __future__ import annotations

from vit_lightning.commands.results.extrapolation import CANVAS_NOTES, TASK
from vit_lightning.core.evalkey import parse
from vit_lightning.records.render import Table
from vit_lightning.records.shapes import Data, fmt_acc
from vit_lightning.records.stats import summarize

SIZE = "model.img_size"
VIEWS = {"": "trained", "zoom": "content zoom", "canvas": "larger canvas"}


def accuracy_by_size(record: dict) -> dict[tuple[int, str], float]:
    """A record's top-1 per (image size, view): its own val/acc at its own size (view ''), each evaluation at
    another size ('zoom' or 'canvas')."""
    config, found = record.get("config") or {}, {}
    size = config.get(SIZE)  # a whole number or a (height, width) pair (the loader's checks): a square's side here
    if (own := (record.get("metrics") or {}).get("val/acc")) is not None and isinstance(size, int):
        found[size, ""] = own
    for name, metrics in (record.get("eval") or {}).items():
        key = parse(name)
        # this view's: the run's own data, task and glyph scale at another size, its own patch size, eval's default
        # grid rules (a kept table or a scaled RoPE is the extrapolation view's, a line of its own)
        if key is None or key.patch is not None or key.rules or not key.of_run(config) or key.view == "native":
            continue
        if (metrics or {}).get("val/acc") is not None and (key.img_size, "") not in found:
            found.setdefault((key.img_size, key.view), metrics["val/acc"])
    return found


def _header(px: int, view: str, views: set, data: Data) -> str:
    """A column's title: its side, its view where there are two, and how the task's answer moves on a larger canvas
    (CANVAS_NOTES) where every cell asks that task."""
    tasks = set(data.cells[TASK]) if TASK in data.cells else set()
    note = CANVAS_NOTES.get(next(iter(tasks))) if view == "canvas" and len(tasks) == 1 else None
    parts = [VIEWS[view]] if view and len(views) > 1 else []
    return f"{px} px" + (f" ({'; '.join(parts + ([note] if note else []))})" if parts or note else "")


def resolution_tables(data: Data, names: dict) -> list[Table]:
    """The cell x image size table (mean ± std over seeds; bold: the size trained at); [] without evaluations."""
    used = data.runs[data.runs["note"] == ""]
    by_cell = {i: [accuracy_by_size(data.records.get(name, {})) for name in used[used["cell"] == i]["name"]]
               for i in data.cells.index}
    columns = sorted({col for runs in by_cell.values() for run in runs for col in run})
    if len(columns) < 2:
        return []
    views = {view for _, view in columns if view}
    title = {"zoom": "resized to that side (content zoom)", "canvas": "on a canvas of that side, the content at its "
             "own scale (larger canvas)"}
    table = Table("Each cell evaluated at other image sizes (columns, px) without fine-tuning, "
                  + " or ".join(title[v] for v in sorted(views)) + ": the position encoding met at the new grid as its "
                  "record's pos_resize says, the patch kernel unchanged; top-1 on the validation set (bold: the size "
                  "it was trained at, its final val/acc)",
                  ["cell", *(_header(px, view, views, data) for px, view in columns)], [])
    for row, i in enumerate(data.cells.index):
        table.rows.append([names[i]] + [fmt_acc(*summarize([run[col] for run in by_cell[i] if col in run]))
                                        for col in columns])
        table.bold |= {(row, 1 + columns.index(col)) for col in columns if col[1] == ""}
    return [table]
