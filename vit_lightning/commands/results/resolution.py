"""The resolution view: each run evaluated at other image sizes without fine-tuning, beside its own size.

`vit-ablate eval RUN --data.img_size=N [--view tokens|zoom|both] --into-record` stores top-1 in the run record under
`eval["<data>@<N>px/<view>"]` (evalkey.py, data/views.py): `tokens`, the content at its trained scale on a canvas of N
(more tokens, the same patches); `zoom-only` (the view `zoom`), the content scaled by N over the trained side on the
trained canvas (the same tokens, each holding more or less of the image); `both`, resized to N (the published
protocol: zoom and more tokens at once). Data that asks several questions names its task and glyph scale
(`glyphs:relative:x1@48px/tokens`), and only the run's own are this view's (keys of before read as evalkey.py says:
`canvas` as tokens, a resize as both). The record's `pos_resize` says how the encoding met the new grid; the size a
run was trained at reads its own `val/acc`. Rows: the cells; columns: the target sizes, each named by its view.
Only the tokens view asks an encoding to extrapolate with the patches it knows (RoPE-ViT's test); a zoom changes
what each patch holds, so every cell falls under it, `none` included.
"""
from __future__ import annotations

from vit_lightning.commands.results.extrapolation import CANVAS_NOTES, TASK
from vit_lightning.core.evalkey import parse
from vit_lightning.records.render import Table
from vit_lightning.records.shapes import Data, fmt_acc
from vit_lightning.records.stats import summarize

SIZE = "model.img_size"
VIEWS = {"": "trained", "tokens": "tokens", "zoom": "zoom", "both": "both"}
# each view's words in the table's title
TITLES = {"tokens": "tokens: on a canvas of that side, the content at its own scale",
          "zoom": "zoom: the content scaled by that side over the trained one, on the trained canvas, the same tokens",
          "both": "both: resized to that side, content zoom and more tokens at once, the published protocol"}


def accuracy_by_size(record: dict) -> dict[tuple[int, str], float]:
    """A record's top-1 per (target size, view): its own val/acc at its own size (view ''), each evaluation at
    another size ('tokens', 'zoom' or 'both')."""
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


def _header(px: int, view: str, data: Data) -> str:
    """A column's title: its side, its view, and how the task's answer moves on a larger canvas (CANVAS_NOTES) where
    every cell asks that task."""
    tasks = set(data.cells[TASK]) if TASK in data.cells else set()
    note = CANVAS_NOTES.get(next(iter(tasks))) if view == "tokens" and len(tasks) == 1 else None
    parts = [VIEWS[view]] if view else []
    return f"{px} px" + (f" ({'; '.join(parts + ([note] if note else []))})" if parts or note else "")


def resolution_tables(data: Data, names: dict) -> list[Table]:
    """The cell x image size table (mean ± std over seeds; bold: the size trained at); [] without evaluations."""
    used = data.runs[data.runs["note"] == ""]
    by_cell = {i: [accuracy_by_size(data.records.get(name, {})) for name in used[used["cell"] == i]["name"]]
               for i in data.cells.index}
    order = list(VIEWS)  # at one side: trained, tokens, zoom, both
    columns = sorted({col for runs in by_cell.values() for run in runs for col in run},
                     key=lambda col: (col[0], order.index(col[1])))
    if len(columns) < 2:
        return []
    views = {view for _, view in columns if view}
    table = Table("Each cell evaluated at other image sizes (columns, px) without fine-tuning, each column named by "
                  "its view (" + "; ".join(TITLES[v] for v in VIEWS if v in views) + "): the position encoding met at "
                  "the new grid as its record's pos_resize says, the patch kernel unchanged; top-1 on the validation set (bold: the size "
                  "it was trained at, its final val/acc)",
                  ["cell", *(_header(px, view, data) for px, view in columns)], [])
    for row, i in enumerate(data.cells.index):
        table.rows.append([names[i]] + [fmt_acc(*summarize([run[col] for run in by_cell[i] if col in run]))
                                        for col in columns])
        table.bold |= {(row, 1 + columns.index(col)) for col in columns if col[1] == ""}
    return [table]
