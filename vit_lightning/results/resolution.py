"""The resolution view: each run evaluated at other image sizes without fine-tuning, beside its own size.

`vit-ablate eval RUN --data.img_size=N --into-record` stores top-1 in the run record under `eval["<data>@<N>px"]`
(the record's `pos_resize` says how the encoding met the new grid); the size a run was trained at reads its own
`val/acc`. Rows: the cells; columns: the image sizes. A larger grid asks an encoding to extrapolate, a smaller one to
interpolate (RoPE-ViT's test, at the demo's scale).
"""

from __future__ import annotations

import re

from vit_lightning.results.render import Table
from vit_lightning.results.shapes import Data, fmt_acc
from vit_lightning.results.stats import summarize

SIZE = "model.img_size"
EVAL_KEY = re.compile(r"(?P<data>[^@]+)@(?P<px>\d+)px")  # a patch-size evaluation ("...px/p4") is not this view's


def accuracy_by_size(record: dict) -> dict[int, float]:
    """A record's top-1 per image size: its own val/acc at its own size, each evaluation at another size."""
    config, found = record.get("config") or {}, {}
    size = config.get(SIZE)  # a whole number or a (height, width) pair (the loader's checks): a square's side here
    if (own := (record.get("metrics") or {}).get("val/acc")) is not None and isinstance(size, int):
        found[size] = own
    for key, metrics in (record.get("eval") or {}).items():
        match = EVAL_KEY.fullmatch(key)
        if match and match["data"] == config.get("data.name") and (metrics or {}).get("val/acc") is not None:
            found.setdefault(int(match["px"]), metrics["val/acc"])
    return found


def resolution_tables(data: Data, names: dict) -> list[Table]:
    """The cell x image size table (mean ± std over seeds; bold: the size trained at); [] without evaluations."""
    used = data.runs[data.runs["note"] == ""]
    by_cell = {i: [accuracy_by_size(data.records.get(name, {})) for name in used[used["cell"] == i]["name"]]
               for i in data.cells.index}
    sizes = sorted({px for runs in by_cell.values() for run in runs for px in run})
    if len(sizes) < 2:
        return []
    trained = {int(size) for name in used["name"]
               if (size := (data.records.get(name, {}).get("config") or {}).get(SIZE)) is not None}
    table = Table("Each cell evaluated at other image sizes (columns, px) without fine-tuning: the position encoding "
                  "met at the new grid as its record's pos_resize says, the patch kernel unchanged; top-1 on the "
                  "validation set (bold: the size it was trained at, its final val/acc)",
                  ["cell", *(f"{px} px" for px in sizes)], [])
    for row, i in enumerate(data.cells.index):
        table.rows.append([names[i]] + [fmt_acc(*summarize([run[px] for run in by_cell[i] if px in run]))
                                        for px in sizes])
        table.bold |= {(row, 1 + sizes.index(px)) for px in trained if px in sizes}
    return [table]
