"""`vit-ablate reproduce rope_vit`: RoPE-ViT's resolution table (Heo et al., ECCV 2024) measured again on the
user's ImageNet validation folder, evaluation only, the published numbers beside the measured ones.

NAVER's DeiT-III S and B weights with axial and mixed RoPE, and the ones with a learned table too ("ape"), as timm
publishes them (`timm/vit_{small,base}_patch16_rope{,_mixed}{,_ape}_224.naver_in1k`), are loaded into our ViT and
evaluated at 224, 320, 384 and 512 px with the published pipeline (the RoPE-ViT code's `--eval-crop-ratio 1.0`:
the short side resized bicubically to the size, the centre crop of that size, ImageNet's mean and std). RoPE needs
no resampling (its rotation takes the larger grid's patch indices, NAVER's convention); a learned table is
resampled bicubically. The pass line: at 224 px each value within 0.1 of timm's own evaluation of the same weights,
at 384 px the published order of the set-ups and each value within 0.4 of the published one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vit_lightning.core.files import now, write_atomic
from vit_lightning.core.parser import CommandParser
from vit_lightning.records.render import Report, Table, to_latex, to_markdown

SIZES = (224, 320, 384, 512)
CROP_RATIO = 1.0  # the published evaluation (RoPE-ViT's deit/README: --eval-crop-ratio 1.0)
CLASSES = 1000
# a row of the table -> the timm model whose NAVER weights it evaluates (None: published, no weights to load)
MODELS = {
    "S ape": None, "S axial": "vit_small_patch16_rope_224", "S mixed": "vit_small_patch16_rope_mixed_224",
    "S axial+ape": "vit_small_patch16_rope_ape_224", "S mixed+ape": "vit_small_patch16_rope_mixed_ape_224",
    "B ape": None, "B axial": "vit_base_patch16_rope_224", "B mixed": "vit_base_patch16_rope_mixed_224",
    "B axial+ape": "vit_base_patch16_rope_ape_224", "B mixed+ape": "vit_base_patch16_rope_mixed_ape_224",
}
# RoPE-ViT's ImageNet-1k top-1 at 224 and 384 px ("ape": DeiT-III with its learned table alone, the baseline)
PUBLISHED = {"S ape": {224: 80.4, 384: 79.4}, "S axial": {224: 80.9, 384: 80.0}, "S mixed": {224: 80.9, 384: 81.8},
             "B ape": {224: 83.4, 384: 82.8}, "B axial": {224: 83.6, 384: 83.9}, "B mixed": {224: 83.8, 384: 84.4}}
TIMM_224 = {"S axial": 81.222, "S mixed": 81.252, "B axial": 83.714, "B mixed": 83.806}  # timm's results table
TOL_224, TOL_384 = 0.1, 0.4


def pass_line(measured: dict[str, dict[int, float]]) -> str:
    """'pass', or 'fail: ...' / 'incomplete: ...' naming every check that does not hold (top-1 in percent)."""
    problems, missing = [], []
    for row, theirs in TIMM_224.items():
        ours = measured.get(row, {}).get(224)
        if ours is None:
            missing.append(f"{row} at 224")
        elif abs(ours - theirs) > TOL_224 + 1e-9:
            problems.append(f"{row} at 224: {ours:.2f} is {ours - theirs:+.2f} from timm's {theirs}")
    for size in ("S", "B"):
        rows = [r for r in PUBLISHED if r.startswith(size) and MODELS[r]]
        have = [r for r in rows if 384 in measured.get(r, {})]
        missing += [f"{r} at 384" for r in rows if r not in have]
        for r in have:
            if abs(measured[r][384] - PUBLISHED[r][384]) > TOL_384 + 1e-9:
                problems.append(f"{r} at 384: {measured[r][384]:.2f} is {measured[r][384] - PUBLISHED[r][384]:+.2f} "
                                f"from the published {PUBLISHED[r][384]}")
        order = sorted(have, key=lambda r: -PUBLISHED[r][384])
        if sorted(have, key=lambda r: -measured[r][384]) != order:
            problems.append(f"{size} at 384: not in the published order ({' > '.join(order)})")
    if problems:
        return "fail: " + "; ".join(problems)
    return "incomplete: not measured: " + ", ".join(missing) if missing else "pass"


def table(measured: dict[str, dict[int, float]], sizes=SIZES, images: int | None = None) -> Report:
    """The resolution table: per row, published and measured top-1 (%) at each size, timm's at 224, the pass line."""
    columns = ["model"]
    for size in sizes:
        columns += [f"{size} (published)", f"{size}"] if any(size in p for p in PUBLISHED.values()) else [f"{size}"]
    rows = []
    for row in MODELS:
        line = [row]
        for size in sizes:
            if any(size in p for p in PUBLISHED.values()):
                line.append(f"{PUBLISHED[row][size]:.1f}" if size in PUBLISHED.get(row, {}) else "-")
            value = measured.get(row, {}).get(size)
            line.append(f"{value:.2f}" if value is not None else ("no weights" if MODELS[row] is None else "-"))
        rows.append(line + [f"{TIMM_224[row]:.3f}" if row in TIMM_224 else "-"])
    caption = "ImageNet-1k top-1 (%) by evaluation resolution, published beside measured"
    header = [("Source", "Heo et al., Rotary Position Embedding for Vision Transformer (ECCV 2024): the multi-resolution "
                         "table; timm's evaluation at 224 px of the same weights"),
              ("Pipeline", f"resize the short side to the size (bicubic), centre crop (crop ratio {CROP_RATIO:g}), "
                           "ImageNet mean and std; RoPE on the larger grid's patch indices, learned tables bicubic"),
              ("Measured on", f"{images} validation images" if images else "-"),
              ("Pass line", f"at 224 px within {TOL_224} of timm's evaluation; at 384 px the published order and "
                            f"each value within {TOL_384} of the published one: **{pass_line(measured)}**")]
    return Report("RoPE-ViT's resolution table, reproduced", "vit-ablate reproduce rope_vit", header,
                  [Table(caption, columns + ["timm at 224"], rows)], Table("Not measured", ["model"], []))


def val_loader(folder: Path, size: int, batch_size: int, workers: int, limit: int | None):
    """The published pipeline over an ImageNet validation folder (FOLDER/<wnid>/*.JPEG, 1000 class folders)."""
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    from vit_lightning.data.sources import IMAGENET_STATS

    classes = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if len(classes) != CLASSES:
        raise ValueError(f"{folder}: an ImageNet validation folder has {CLASSES} class folders (n01440764 ...), "
                         f"found {len(classes)}")
    tf = v2.Compose([v2.Resize(int(size / CROP_RATIO), interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
                     v2.CenterCrop(size), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(*IMAGENET_STATS)])
    data = datasets.ImageFolder(str(folder), transform=tf, allow_empty=True)
    if limit:
        data = torch.utils.data.Subset(data, range(min(limit, len(data))))
    return torch.utils.data.DataLoader(data, batch_size=batch_size, num_workers=workers), len(data)


def evaluate(source, size: int, loader, device: str) -> dict:
    """Top-1, top-5 and loss of a timm source (run.transfer.Source) loaded into our ViT at `size`."""
    from vit_lightning.analysis.evaluate import accuracy
    from vit_lightning.model.build import build_backbone
    from vit_lightning.run.transfer import start_from

    vit = build_backbone(**{**source.options, "img_size": size})
    start_from(vit, source, "bicubic")
    return {"id": source.id, **accuracy(vit.to(device), loader)}


def source_of(name: str, weights: Path | None) -> str:
    """`timm:NAME@FILE` for a file in the weights folder (NAME.pth), else `timm:NAME` (timm downloads it)."""
    file = weights / f"{name}.pth" if weights else None
    return f"timm:{name}@{file}" if file and file.is_file() else f"timm:{name}"


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _at_least(text, 1)


def positive_or_zero(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer of at least {low}, got {text!r}")
    return value


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate reproduce", description="a published table measured again: rope_vit, "
                      "RoPE-ViT's ImageNet top-1 at 224 to 512 px with NAVER's weights, beside the paper's")
    p.add_argument("target", choices=("rope_vit",), help="the published table to reproduce")
    p.add_argument("--imagenet-val", type=Path, required=True, metavar="DIR",
                   help="ImageNet's validation images, one folder per class: DIR/n01440764/*.JPEG, ... (1000)")
    p.add_argument("--weights", type=Path, metavar="DIR", help="NAME.pth state dicts (default: timm downloads them)")
    p.add_argument("--models", nargs="+", choices=[r for r, m in MODELS.items() if m], metavar="ROW",
                   help="rows to measure (default: all with weights)")
    p.add_argument("--sizes", nargs="+", type=int, choices=SIZES, default=list(SIZES))
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1")
    p.add_argument("--batch-size", type=positive, default=64)
    p.add_argument("--workers", type=positive_or_zero, default=4, help="loader processes")
    p.add_argument("--limit", type=positive, help="the first N images only (a quick check; the pass line needs all)")
    p.add_argument("--out", type=Path, default=Path("results") / "reproduce" / "rope_vit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Measure every (row, size) not measured yet into OUT/records/, then write OUT/table.md and table.tex."""
    args = parser().parse_args(argv)
    rows = args.models or [r for r, m in MODELS.items() if m]
    measured: dict[str, dict[int, float]] = {}
    images = None
    try:
        from vit_lightning.analysis.evaluate import check_device

        check_device(args.device)
        loaders = {size: val_loader(args.imagenet_val, size, args.batch_size, args.workers, args.limit)
                   for size in args.sizes}
        for row in rows:
            sources: dict = {}  # the weights read once per row, for all its sizes
            for size, (loader, images) in loaders.items():
                measured.setdefault(row, {})[size] = 100 * measure(args, row, size, loader, images, sources)["val/acc"]
    except (ValueError, OSError) as error:  # not ImageNet's folder, weights of another model, no network
        print(f"vit-ablate reproduce: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    report = table(measured, tuple(args.sizes), images)
    write_atomic(args.out / "table.md", to_markdown(report).encode())
    write_atomic(args.out / "table.tex", to_latex(report).encode())
    print(f"{pass_line(measured)}\nwrote {args.out / 'table.md'}")
    return 0


def measure(args, row: str, size: int, loader, images: int, sources: dict) -> dict:
    """One (row, size): its record from OUT/records/ when it measured these weights on these images, else measured."""
    source = source_of(MODELS[row], args.weights)
    path = args.out / "records" / f"{row.replace(' ', '_').replace('+', '_')}-{size}px.json"
    try:
        old = json.loads(path.read_text())
        if old["source"] == source and old["images"] == images:
            return old["metrics"]
    except (OSError, ValueError, KeyError):
        pass
    from vit_lightning.run.transfer import read_source

    start = time.monotonic()
    if source not in sources:
        sources[source] = read_source(source)
    metrics = evaluate(sources[source], size, loader, args.device)
    record = {"row": row, "size": size, "source": source, "id": metrics.pop("id"), "images": images,
              "crop_ratio": CROP_RATIO, "metrics": metrics, "seconds": round(time.monotonic() - start, 1),
              "finished_at": now()}
    write_atomic(path, (json.dumps(record, indent=2) + "\n").encode())
    print(f"{row} at {size} px: top-1 {100 * metrics['val/acc']:.2f} ({record['seconds']} s)", flush=True)
    return metrics
