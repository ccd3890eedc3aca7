"""`vit-ablate eval SOURCE [--data.KEY=VALUE ...]`: top-1, top-5, loss and few-shot of a trained model, no training.

SOURCE is what `fit --model.init_from` takes (a run dir, a .ckpt, timm:NAME, timm:NAME@FILE). The data
defaults to the run's own; any `--data.*` option changes it (another dataset, another img_size), and the
position encoding is resampled as fine-tuning would resample it. Another img_size zooms stored images (the content
changes scale) unless `--data.resize=pad` centres them on a larger canvas; glyphs and translated_mnist are drawn at
the new canvas, the content at its own scale. `--view tokens|zoom|both` at --data.img_size=N separates more tokens
from zoom (data/views.py: the trained pixel scale on an N canvas; the content rescaled on the trained canvas; resized),
and `--declared` runs every (size, view) the run's profile declares. Each evaluation is filed under what it measured
(evalkey.py: data, task and glyph scale, size, view, patch size), so one on another task or glyph scale is filed
apart from the run's own. Several SOURCEs are evaluated in turn; evaluations of one run by several processes add to its record side by
side, and none works while a fit trains the run.
`--model.patch_size=N` evaluates at another patch size, the patch kernel PI-resized (FlexiViT) and the encodings
resampled to the new grid. `--pos-resample keep` keeps learned tables' trained entries instead of interpolating them,
`--rope-scaling ntk|yarn` changes RoPE's frequencies on a larger grid; both, away from their defaults, are part of the
record's key. With the source's head, val/acc_shuffled and val/shuffle_drop too (the patches of every image permuted,
shuffle.py). The attention read-outs (analysis/attention.py: per block mean entropy and distance in tokens, of
--attention-images images) go into the record as `attention` and beside the metrics in the run record. The numbers
go to a JSON record beside the checkpoint (or --out), or into the run's results.json with --into-record.

A head is only as good as the classes it was trained on: on data with another number of classes (or with
--new-head) the head is new and untrained, so only few-shot (which fits its own linear classifier on the frozen
features) is reported, never top-1, top-5 or loss. A run of a family with windows is evaluated as it was trained, at its own image
size (its windows are not resampled). Bad options (--shots, --device, --out, --into-record) are one-line
errors before anything is evaluated or written.

StartAccuracy is fit's callback for a run started from a trained model: the same top-1 before fine-tuning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import yaml
from typing_extensions import override

from vit_lightning.ablation import load
from vit_lightning.analysis import fewshot
from vit_lightning.analysis.attention import readouts
from vit_lightning.analysis.shuffle import PERMUTATIONS, block_error, shuffled_accuracy, validation_batches
from vit_lightning.analysis.trained import TrainedError, build_data, load_trained
from vit_lightning.core.checks import number_in
from vit_lightning.core.evalkey import EvalKey
from vit_lightning.core.files import now, write_atomic
from vit_lightning.core.identity import plain
from vit_lightning.core.names import BEST_METRIC, RECORD, SHUFFLE_DROP, SHUFFLED_ACC
from vit_lightning.core.parser import CommandParser
from vit_lightning.data.datamodule import SOURCES
from vit_lightning.data.views import VIEWS, geometry
from vit_lightning.model.build import build_backbone
from vit_lightning.model.family import ATTENTION_MAPS, DEFAULT_ARCH, FAMILIES, RESIZE, TOKEN_GRID, family_of
from vit_lightning.model.position import set_frequency_rule
from vit_lightning.model.rope import NO_SCALING, SCALINGS
from vit_lightning.run.record import RunRecord
from vit_lightning.run.rundir import (
    Busy,
    RunDirError,
    checkpoint_path,
    held,
    read_checkpoint,
    read_record,
    update_record,
)
from vit_lightning.run.transfer import (
    RESAMPLE,
    Source,
    SourceError,
    account,
    check_data,
    read_source,
    sha256,
    source_kind,
    start_from,
)


@torch.no_grad()
def accuracy(vit: torch.nn.Module, loader, progress: bool = False) -> dict[str, float]:
    """Top-1, top-5 (top-K when K < 5 classes) and mean cross-entropy of the backbone over a loader, in eval mode."""
    device = next(vit.parameters()).device
    was_training, (hits1, hits5, loss, n) = vit.training, (0, 0, 0.0, 0)
    vit.eval()
    batches = loader
    if progress:
        from rich.progress import track

        batches = track(loader, description="evaluating", transient=True)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = torch.cat([vit(part).float() for part in x.split(_chunk(vit, x))])  # (B, K)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices  # (B, 5)
        hits1 += int((top[:, 0] == y).sum())
        hits5 += int((top == y[:, None]).any(1).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        n += len(y)
    vit.train(was_training)
    return {"val/acc": hits1 / n, "val/acc5": hits5 / n, "val/loss": loss / n}


PAIR_BUDGET = 2**25  # images x tokens^2 per forward: a 28 x 28 canvas (785 tokens) runs 54 images at a time


def _chunk(vit: torch.nn.Module, x: torch.Tensor) -> int:
    """Images per forward so that attention maps (images x tokens^2) stay within PAIR_BUDGET on a large canvas."""
    patch = getattr(vit.config, "patch_size", None) or 1
    tokens = max(1, (x.shape[-2] // patch) * (x.shape[-1] // patch))
    return max(1, PAIR_BUDGET // tokens**2)


class StartAccuracy(pl.Callback):
    """Into the record: the source's own accuracy and, before any fine-tuning, the accuracy on the new data.

    `transfer/source_acc` is the source record's val/acc_best (at its resolution); `transfer/start_acc` the
    started model's top-1 on the validation batches fit validates on (resampled encodings, no training).
    """

    def __init__(self, source: Source):
        self.metrics = {"transfer/source_acc": (source.account.get("metrics") or {}).get(BEST_METRIC)}

    @override
    def state_dict(self) -> dict:
        return dict(self.metrics)  # a resumed run keeps the numbers measured before it first trained

    @override
    def load_state_dict(self, state: dict) -> None:
        self.metrics = dict(state)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == 0 and trainer.is_global_zero:
            self.metrics["transfer/start_acc"] = accuracy(pl_module.model, validation_batches(trainer))["val/acc"]
        for callback in trainer.callbacks:
            if isinstance(callback, RunRecord):
                callback.add_metrics(self.metrics)


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate eval", description=__doc__.split(":", 1)[1].strip().split("\n")[0])
    p.add_argument("source", nargs="+", help="a run dir, a .ckpt, timm:NAME or timm:NAME@FILE (several: each in turn)")
    p.add_argument("--model.patch_size", dest="patch_size", type=int, default=None,
                   help="evaluate at this patch size (the kernel PI-resized; default: the source's)")
    p.add_argument("--view", choices=VIEWS, default=None,
                   help="how the images meet the target side --data.img_size=N (data/views.py): tokens (the content at "
                        "its trained scale on an N canvas: more tokens, a larger field), zoom (the content scaled by N "
                        "over the trained side on the trained canvas: the same tokens) or both (resized to N, the "
                        "published protocol); default: the data's own (resized; padded with --data.resize=pad; a "
                        "dataset that draws, on the N canvas)")
    p.add_argument("--declared", action="store_true",
                   help="every evaluation the run's profile declares (its `views`: target sides, each in its views), "
                        "one after another, instead of --data.img_size and --view")
    p.add_argument("--pos-resample", choices=RESAMPLE, default="bicubic",
                   help="how learned tables meet a new grid: interpolated (bicubic, bilinear, nearest) or keep (trained "
                        "entries kept bit for bit, offsets or positions beyond the trained range clamped to the edge)")
    p.add_argument("--rope-scaling", choices=SCALINGS, default=NO_SCALING,
                   help="RoPE's frequencies on a grid larger than trained: none (plain extension), ntk (NTK-aware base) "
                        "or yarn (YaRN's per-frequency ramp and temperature)")
    p.add_argument("--attention-images", type=int, default=READOUT_IMAGES,
                   help=f"validation images for the attention read-outs (per block mean entropy and distance in "
                        f"tokens; default {READOUT_IMAGES}; 0: none)")
    p.add_argument("--shots", type=int, nargs="*", default=list(fewshot.SHOTS), help="few-shot k ([]: none)")
    p.add_argument("--out", type=Path, default=None, help="JSON record to write (default: beside the checkpoint)")
    p.add_argument("--into-record", action="store_true", help="also add the numbers to the run's results.json")
    p.add_argument("--shuffle-perms", type=int, default=PERMUTATIONS,
                   help=f"permutations of each image's patches for val/acc_shuffled (default {PERMUTATIONS}; 0: none)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1")
    p.add_argument("--new-head", action="store_true",
                   help="the data's classes are not the source's: few-shot only (the default when the counts differ)")
    return p


MAX_PATCH, MAX_SHOTS, MAX_PERMS = 4096, 10**5, 1000  # bounds on eval's numbers, far above any real setting
READOUT_IMAGES, MAX_READOUT = 16, 10**5  # read-out images: 16 x N queries per block mean (12,544 at 28x28), cheap enough there


def check_args(args) -> None:
    """--shots, --device, --out and --into-record problems as one-line ValueErrors, before anything runs."""
    if bad := [k for k in args.shots if k < 1]:
        raise ValueError(f"--shots {bad[0]}: a few-shot k is a number of images per class, 1 or more")
    if args.patch_size is not None and not number_in(args.patch_size, 1, MAX_PATCH, integer=True):
        raise ValueError(f"--model.patch_size={args.patch_size}: a patch side in pixels, 1 to {MAX_PATCH} "
                         "(the image's side at most)")
    if bad := [k for k in args.shots if k > MAX_SHOTS]:
        raise ValueError(f"--shots {bad[0]}: a few-shot k is at most {MAX_SHOTS} images per class")
    if not 0 <= args.shuffle_perms <= MAX_PERMS:
        raise ValueError(f"--shuffle-perms {args.shuffle_perms}: a count of permutations, 0 (none) to {MAX_PERMS}")
    if not 0 <= args.attention_images <= MAX_READOUT:
        raise ValueError(f"--attention-images {args.attention_images}: a count of images, 0 (none) to {MAX_READOUT}")
    check_device(args.device)
    if args.out is not None:
        check_writable(args.out, "--out")
    if args.into_record:
        if source_kind(args.source) == "timm":
            raise ValueError(f"--into-record: {args.source} has no run record; give a run dir or its checkpoint")
        directory = checkpoint_path(Path(args.source)).parent
        try:
            found = read_record(directory)
        except RunDirError as error:
            raise ValueError(f"--into-record: {error}") from None
        if found is None:
            raise ValueError(f"--into-record: cannot read the run record {directory / RECORD}: there is none")
        check_writable(directory / RECORD, "--into-record")


def check_device(text: str) -> None:
    """A device torch knows and this machine has."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device {text}: not a device; give cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if not count:
            raise ValueError(f"--device {text}: this machine has no CUDA GPU; give --device cpu")
        if (device.index or 0) >= count:
            raise ValueError(f"--device {text}: this machine has {count} GPU(s): cuda:0 to cuda:{count - 1}")
    elif device.type != "cpu":
        raise ValueError(f"--device {text}: give cpu, cuda or cuda:N")


def check_writable(path: Path, option: str) -> None:
    """The file can be written there: not a folder, and its nearest existing folder is writable (nothing made)."""
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; give a file name")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write in {folder} (no permission)")


def data_changes(extra: list[str]) -> dict:
    """--data.KEY=VALUE options as {KEY: value} (values read as YAML: 56, true, cifar10); ValueError otherwise."""
    out = {}
    for arg in extra:
        key, sep, value = arg.partition("=")
        if not key.startswith("--data.") or not sep:
            raise ValueError(f"unknown option {arg!r}: only --data.KEY=VALUE options change the data")
        out[key[len("--data."):]] = yaml.safe_load(value)
    return out


def run(args, changes: dict) -> tuple[dict, Path]:
    """The evaluation record of args.source on its (changed) data, and where it goes."""
    if source_kind(args.source) == "timm" or _transfers(Path(args.source)):
        vit, datamodule, about, data = _resampled(args, changes)
    else:
        vit, datamodule, about, data = _as_trained(args, changes)
    trained_classes = about["classes"]
    new_head = args.new_head or trained_classes != datamodule.num_classes
    if new_head and not args.shots:
        raise ValueError("the head is new (untrained) for these classes, so only few-shot is reported: give --shots")
    if new_head and not args.new_head:
        print(f"vit-ablate eval: the data has {datamodule.num_classes} classes, the source's head {trained_classes}: "
              "that head never saw these classes, so top-1, top-5 and loss are not reported (few-shot only; "
              "--new-head says so)", file=sys.stderr, flush=True)
    set_frequency_rule(vit, args.rope_scaling)  # before anything runs: a rule without RoPE is refused here
    beside = Path(about["file"]).parent if about.get("file") else Path(".")
    options = {**(data or {}), **changes}
    key = eval_key(datamodule, options, data or {}, about, args.view)
    out = args.out or beside / f"{out_name(key).removesuffix('.json')}{_rule_suffix(args, '-')}.json"
    if args.out is None:
        check_writable(out, "the eval record")
    vit.to(args.device)
    metrics = {} if new_head else accuracy(vit, datamodule.val_dataloader(), progress=sys.stderr.isatty())
    if not new_head and args.shuffle_perms:
        metrics.update(_shuffled(vit, datamodule, args.shuffle_perms))
    if args.shots:
        metrics.update(fewshot.evaluate(vit, datamodule, tuple(args.shots)))
    record = {"source": {k: v for k, v in about.items() if k not in ("classes", "trained_size")}, "data": options,
              "key": str(key) + _rule_suffix(args, "/"), "img_size": datamodule.img_size, "view": key.view,
              "patch_size": vit.config.patch_size, "pos_resample": args.pos_resample, "rope_scaling": args.rope_scaling,
              "new_head": new_head,
              "metrics": metrics, "finished_at": now()}
    if attention := _readouts(vit, datamodule, args.attention_images):
        record["attention"] = attention
    return record, out


def eval_key(datamodule, options: dict, own: dict, about: dict, view: str | None = None) -> EvalKey:
    """What this evaluation measures, against the run's own data options `own` and image size (evalkey.py); with a
    view (--view), that view at the target side options["img_size"]."""
    asks = bool(datamodule.source.tasks)  # data of several questions: its task and glyph scale name what was measured
    scale = options.get("glyph_scale") or 1
    side = options["img_size"] if view else datamodule.img_size
    same_side = datamodule.img_size == about.get("trained_size")
    if view is None and asks and scale != (own.get("glyph_scale") or 1):  # drawn at another scale: content zoomed
        view = "zoom" if same_side else "both"
    elif view is None:
        view = "native" if same_side else "tokens" if datamodule.view == "canvas" else "both"
    resized = about.get("patch_resize")
    return EvalKey(str(options.get("name")), side, view, options.get("task") if asks else None,
                   scale if asks else None, resized["to"] if resized else None)


def out_name(key: EvalKey) -> str:
    """eval-<data>[-<task>-x<scale>]-<N>px[-tokens|-zoom][-p<patch>].json: the record file of one evaluation, by its
    key (resized, the data's plain way to another side, or native: no view in the name)."""
    asks = f"-{key.task}-x{key.scale}" if key.task is not None else ""
    return (f"eval-{key.data}{asks}-{key.img_size}px" + (f"-{key.view}" if key.view in ("tokens", "zoom") else "")
            + (f"-p{key.patch}" if key.patch else "") + ".json")


def viewed_data(options: dict, changes: dict, view: str | None, trained):
    """The data module evaluated on: the run's data options with `changes`, and with a view, its validation images
    as that view shows them at the target side changes["img_size"] (data/views.py)."""
    if view is None:
        return build_data(options, **changes)
    target, given = changes.get("img_size"), {**options, **changes}
    if not isinstance(trained, int) or isinstance(trained, bool):
        raise ValueError(f"--view {view}: the run trained at {trained!r}, not one square side to view from")
    if not isinstance(target, int) or target == trained:
        raise ValueError(f"--view {view}: give the target side with --data.img_size=N, other than the {trained} px "
                         "the run trained at")
    if "resize" in changes or "glyph_scale" in changes or given.get("resize", "zoom") != "zoom":
        raise ValueError(f"--view {view} decides how the images meet {target} px: leave --data.resize and "
                         "--data.glyph_scale out (and a run trained on padded images has no view)")
    resize, canvas = geometry(view, trained, target)
    name = given.get("name", "mnist5k")
    if view == "tokens" and name in SOURCES and SOURCES[name].renders:
        return build_data(options, **changes)  # drawn on the target canvas: the content at its scale, a larger field
    datamodule = build_data(options, **{**changes, "img_size": trained})  # as trained, then viewed
    datamodule.view_at(resize, canvas)
    return datamodule


def _rule_suffix(args, sep: str) -> str:
    """The grid rules away from their defaults, for the record's file name and its key: '' for the defaults."""
    rules = [args.pos_resample] if args.pos_resample != "bicubic" else []
    rules += [f"rope-{args.rope_scaling}"] if args.rope_scaling != NO_SCALING else []
    return "".join(sep + rule for rule in rules)


def _readouts(vit, datamodule, images: int) -> dict | None:
    """The attention read-outs at the evaluated grid (analysis.attention.readouts), or None (and a note) without."""
    family = family_of(vit)
    if not images or (error := family.lacks(ATTENTION_MAPS, "the attention read-outs")
                      or family.lacks(TOKEN_GRID, "the attention read-outs")):
        if images:
            print(f"vit-ablate eval: no attention read-outs: {error}", file=sys.stderr, flush=True)
        return None
    side = datamodule.img_size
    grid = tuple(vit.stem.grid_for(side if isinstance(side, tuple) else (side, side)))
    return readouts(vit, datamodule.val_dataloader(), images, grid)


def _shuffled(vit, datamodule, count: int) -> dict[str, float]:
    """val/acc_shuffled and val/shuffle_drop; none (and a note) when the images are not whole patches."""
    size = (datamodule.img_size, datamodule.img_size)
    if error := family_of(vit).lacks(TOKEN_GRID, "the shuffled-patch accuracy") or block_error(size, vit.config.patch_size):
        print(f"vit-ablate eval: no shuffled-patch accuracy: {error}", file=sys.stderr, flush=True)
        return {}
    return shuffled_accuracy(vit, datamodule.val_dataloader(), vit.config.patch_size, count)


def _transfers(path: Path) -> bool:
    """Whether the run's family resamples to new data (else it is evaluated as trained)."""
    arch = read_checkpoint(path)["hyper_parameters"].get("arch", DEFAULT_ARCH)
    return arch in FAMILIES and FAMILIES[arch].lacks(RESIZE, "") is None


def _resampled(args, changes: dict):
    """A source built for the new data: encodings resampled (and the patch kernel), the source's head or a new one."""
    source = read_source(args.source)
    if source.data is None and "name" not in changes:
        raise SourceError(f"{args.source} names no data: give --data.name (and --data.img_size)")
    datamodule = viewed_data(source.data or {}, changes, args.view, source.options.get("img_size"))
    patch = args.patch_size or source.options.get("patch_size")
    vit = build_backbone(**{**source.options, "img_size": datamodule.img_size, "in_chans": datamodule.in_chans,
                            "num_classes": datamodule.num_classes, "patch_size": patch})
    check_data(source, vit.config.in_chans)
    start_from(vit, source, args.pos_resample, new_head=args.new_head)
    about = account(source, patch, datamodule.img_size, args.pos_resample)
    trained = {"classes": source.options.get("num_classes"), "trained_size": source.options.get("img_size")}
    return vit, datamodule, {**about, **trained}, source.data


def _as_trained(args, changes: dict):
    """A run of a family that does not resample to new data (windows): evaluated as trained, at its own image size."""
    trained = load_trained(Path(args.source), data=False)
    if trained.record is not None and trained.record.get("status") != "completed":
        raise SourceError(f"{args.source}: the run did not finish (status {trained.record.get('status')!r}); "
                          "finish it first (the same fit command resumes it)")
    if trained.data_options is None and "name" not in changes:
        raise SourceError(f"{args.source} names no data: give --data.name (and --data.img_size)")
    model, config = trained.model.model, trained.model.model.config
    datamodule = viewed_data(trained.data_options or {}, changes, args.view, config.img_size)
    size = config.img_size
    if (datamodule.img_size, datamodule.in_chans) != (size, config.in_chans):
        raise ValueError(f"{args.source}: a {config.arch} run is evaluated at its own image size and channels "
                         f"({size} px, {config.in_chans}), not {datamodule.img_size} px, {datamodule.in_chans}")
    account = {"source": args.source, "file": str(trained.checkpoint), "sha256": sha256(trained.checkpoint),
               "trial": (trained.record or {}).get("trial"), "classes": config.num_classes, "trained_size": size}
    return model, datamodule, account, trained.data_options


def add_eval(record: dict):
    """The change that files an evaluation record under the run record's `eval`, by what it measured (its `key`:
    data, task and glyph scale, image size, view, patch size, and the grid rules where not the defaults; evalkey.py)."""
    key = record["key"]

    def change(run_record: dict) -> None:  # the read-outs beside the metrics, as numbers (attn/...)
        run_record.setdefault("eval", {})[key] = {**record["metrics"], **record.get("attention", {})}
    return change


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    p.refuse([arg for arg in extra if not arg.startswith("--data.")])  # the --data.* options change the data
    if (len(args.source) > 1 or args.declared) and args.out is not None:
        print("vit-ablate eval: error: --out names one file; give one source and leave --declared out, or leave --out "
              "out", file=sys.stderr)
        return 2
    codes = []
    for source in args.source:
        try:
            jobs = declared(source, args, extra) if args.declared else [(args.view, extra)]
        except ValueError as error:
            print(f"vit-ablate eval: error: {error}", file=sys.stderr)
            codes.append(2)
            continue
        codes += [evaluate_one(argparse.Namespace(**{**vars(args), "source": source, "view": view}), more)
                  for view, more in jobs]
    return max(codes)


def declared(source: str, args, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(view, options) of each evaluation the run's profile declares (Profile.views); ValueError (one line) else."""
    if args.view is not None or any(arg.startswith("--data.img_size") for arg in extra):
        raise ValueError("--declared takes its sizes and views from the run's profile: leave --view and "
                         "--data.img_size out")
    if source_kind(source) == "timm":
        raise ValueError(f"--declared: {source} has no profile; give a run dir")
    try:
        config = (read_record(checkpoint_path(Path(source)).parent) or {}).get("config") or {}
        names = (config.get("run.ablation"), config.get("run.profile"))
        prof = load(str(names[0])).profile(str(names[1]))
    except (RunDirError, ValueError, OSError) as error:
        raise ValueError(f"--declared: {source}: its record names no profile with evaluations "
                         f"({' '.join(str(error).split())})") from None
    if not prof.views:
        raise ValueError(f"--declared: profile {names[1]!r} of {names[0]} declares no evaluations (its `views`)")
    return [(view, [*extra, f"--data.img_size={side}"]) for side, views in prof.views for view in views]


def evaluate_one(args, extra: list[str]) -> int:
    """Evaluate args.source (one of them): its record written, exit code 0; or one line and 2."""
    try:
        check_args(args)
        changes = data_changes(extra)
        # with --into-record the run's lock is held from before the work to the write: a fit training the run would
        # overwrite the numbers, so one running now refuses this, and one started meanwhile is refused
        directory = checkpoint_path(Path(args.source)).parent
        # a shared hold: evaluations of one run work side by side, each adding its numbers to the record in turn
        with held(directory, shared=True) if args.into_record else contextlib.nullcontext() as lock:
            record, out = run(args, changes)
            if args.into_record:  # first, so a refusal writes nothing
                update_record(directory, add_eval(record), lock=lock)
            write_atomic(out, (json.dumps(plain(record), indent=2) + "\n").encode())
    except (ValueError, TrainedError, OSError, Busy) as error:
        print(f"vit-ablate eval: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    m = record["metrics"]
    shots = fewshot.describe(m, args.shots) if args.shots else ""
    if record["new_head"]:
        print(f"few-shot (frozen features; the head is new, so no top-1, top-5 or loss): {shots}\nwrote {out}")
    else:
        shuffled = f", shuffled top-1 {m[SHUFFLED_ACC]:.4f} (drop {m[SHUFFLE_DROP]:+.4f})" if SHUFFLED_ACC in m else ""
        print(f"top-1 {m['val/acc']:.4f}, top-5 {m['val/acc5']:.4f}, loss {m['val/loss']:.4f}{shuffled}"
              + (f", {shots}" if shots else "") + f"\nwrote {out}")
    if args.into_record:
        print(f"updated {Path(record['source']['file']).parent / RECORD}")
    return 0
