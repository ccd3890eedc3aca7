"""Start from a trained model, the paper's transfer protocol (section 3.2).

A source is a run directory, a `vit-ablate fit` checkpoint, `timm:NAME` (weights downloaded by timm)
or `timm:NAME@FILE` (a local file holding that timm model's state dict). The new run takes the
source's architecture (a patch stem's patch size may change: its kernel is PI-resized, see model/flexi.py),
resamples each position encoding to the new patch grid the way that encoding must be resampled, and gets
the paper's zero-initialised head when the classes change (or when asked).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from vit_lightning.core.checks import one_line
from vit_lightning.core.names import LAST_CKPT
from vit_lightning.model.build import build_backbone, timm_twin
from vit_lightning.model.config import ModelConfig, option_names
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES, RESIZE, architecture_keys
from vit_lightning.model.position import resize_note
from vit_lightning.model.vit import pixel_patches
from vit_lightning.run.rundir import RunDirError, checkpoint_record, data_options, read_checkpoint

RESIZED = ("patch_size",)  # architecture options a patch-stem source may change: its kernel is PI-resized (FlexiViT)
DATA_KEYS = ("img_size", "in_chans", "num_classes")  # from the new data; img_size and num_classes may change
RESAMPLE = ("bicubic", "bilinear", "nearest", "keep")  # model.pos_resample: learned tables interpolated, or kept (KEEP)
TIMM = "timm:"


class SourceError(ValueError):
    """A source that cannot start a run; one line naming the problem."""


@dataclass
class Source:
    """A trained backbone: its ModelConfig options, its state dict and the record's account of where it came from."""

    options: dict  # ModelConfig fields of the source (architecture and the data it saw)
    state: dict[str, torch.Tensor]  # backbone parameter names -> tensors
    account: dict  # {"source", "trial" | "file", "sha256", "config"} for the run record
    data: dict | None = None  # the data module options the source trained with (None: not known)
    id: str = ""  # canonical: "trial:ID" of a run, "sha256:HEX" of a lone checkpoint, "timm:NAME[@sha256:HEX]"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def named_by_source(params: dict) -> dict:
    """A sweep trial's parameters as its name hashes them: a run-directory source by its trial id (the directory's
    name), so `runs/x`, `/abs/runs/x` and `runs/../runs/x` name one trial, before the source even exists."""
    text = params.get("model.init_from")
    if not text or source_kind(str(text)) != "run":
        return params
    return {**params, "model.init_from": f"trial:{Path(str(text)).resolve().name}"}


def source_kind(text: str) -> str:
    """timm (`timm:...`), checkpoint (a file, or a path ending in .ckpt) or run (a run directory)."""
    path = Path(text)
    return "timm" if text.startswith(TIMM) else "checkpoint" if path.is_file() or path.suffix == ".ckpt" else "run"


def source_checkpoint(text: str) -> Path:
    """The checkpoint a run or checkpoint source names (a run directory's last.ckpt)."""
    return Path(text) / LAST_CKPT if source_kind(text) == "run" else Path(text)


def source_problem(text: str) -> str | None:
    """Why a run or checkpoint source cannot be read yet (no checkpoint, its run unfinished), in one line; or None.

    The rule "the source finished", for fit and the sweep alike: a checkpoint exists and the record beside it,
    if any, says completed.
    """
    ckpt = source_checkpoint(text)
    if not ckpt.is_file():
        return f"no checkpoint at {ckpt}"
    try:
        record = checkpoint_record(ckpt)
    except RunDirError as error:
        return str(error)
    if record is not None and record.get("status") != "completed":
        return (f"the run did not finish (status {record.get('status')!r}); "
                "finish it first (the same fit command resumes it)")
    return None


def read_source(text: str) -> Source:
    """The source named by `text`, read from its files now; SourceError (one line) when it is missing, unfinished,
    foreign or inconsistent. A fit reads it once (`resolve`), so a source trained again is never served stale."""
    return _timm_source(text[len(TIMM):]) if source_kind(text) == "timm" else _run_source(text)


def _run_source(text: str) -> Source:
    """A run directory's or a checkpoint's source (see read_source)."""
    if problem := source_problem(text):
        raise SourceError(f"model.init_from={text}: {problem}")
    ckpt = source_checkpoint(text)
    try:
        record = checkpoint_record(ckpt)
        state = read_checkpoint(ckpt)
    except RunDirError as error:
        raise SourceError(f"model.init_from={text}: {error}") from None
    names = option_names()
    options = {k: v for k, v in state["hyper_parameters"].items() if k in names}
    arch = options.get("arch", DEFAULT_ARCH)
    if arch not in FAMILIES or FAMILIES[arch].lacks(RESIZE, "a transfer"):  # e.g. windows fixed to one grid
        able = ", ".join(name for name, family in FAMILIES.items() if not family.lacks(RESIZE, ""))
        why = FAMILIES[arch].lacks(RESIZE, "a transfer") if arch in FAMILIES else f"arch={arch} is not a family"
        raise SourceError(f"model.init_from={text}: a {arch} source cannot start a run ({why}); "
                          f"only {able} sources (runs, checkpoints, timm models) can")
    weights = {k[len("model."):]: v for k, v in state["state_dict"].items() if k.startswith("model.")}
    check_weights(text, options, weights)
    digest, trial = sha256(ckpt), (record or {}).get("trial")
    account = {"source": text, "file": str(ckpt), "sha256": digest, "trial": trial,
               "config": (record or {}).get("config") or options, "metrics": (record or {}).get("metrics") or {}}
    return Source(options, weights, account, data_options(state, record), f"trial:{trial}" if trial else f"sha256:{digest}")


def check_weights(text: str, options: dict, weights: dict[str, torch.Tensor]) -> None:
    """The weights load into a model of the source's own config (built on the meta device: no memory used)."""
    try:
        with torch.device("meta"):
            expected = build_backbone(**options).state_dict()
    except (TypeError, ValueError) as error:
        raise SourceError(f"model.init_from={text}: its config does not build a model: {one_line(error)}") from None
    if problem := first_mismatch(expected, weights):
        raise SourceError(f"model.init_from={text}: its weights do not fit its config ({problem})")


def first_mismatch(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor]) -> str | None:
    """The first key missing from `given`, of another shape there, or there in excess; None when they fit."""
    for key, tensor in expected.items():
        if key not in given:
            return f"{key} is missing from the weights"
        if tuple(given[key].shape) != tuple(tensor.shape):
            return f"{key} is {tuple(given[key].shape)} in the weights, {tuple(tensor.shape)} in the config"
    extra = [key for key in given if key not in expected]
    return f"{extra[0]} in the weights has no place in the config" if extra else None


def _timm_source(spec: str) -> Source:
    """`NAME` (pretrained, downloaded by timm) or `NAME@FILE` (that model's state dict in a local file)."""
    import timm

    name, _, file = spec.partition("@")
    where = f"model.init_from=timm:{spec}"
    if file and not Path(file).is_file():
        raise SourceError(f"{where}: no weights file at {file}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True) if file else None
        classes = {"num_classes": len(state["head.bias"])} if state and "head.bias" in state else {}
        reference = timm.create_model(name, pretrained=not file, **classes)
        if state is not None:
            reference.load_state_dict(state)
    except Exception as error:  # unknown name, no network, weights of another model
        raise SourceError(f"{where}: {one_line(error)}") from None
    try:
        options, ours = timm_twin(reference)
    except (TypeError, ValueError) as error:
        raise SourceError(f"{where}: {one_line(error)}") from None
    digest = sha256(Path(file)) if file else None
    account = {"source": f"timm:{spec}", "file": file or None, "sha256": digest,
               "trial": None, "config": {"timm": name, **options}}
    return Source(options, ours.state_dict(), account, id=f"{TIMM}{name}" + (f"@sha256:{digest}" if file else ""))


@dataclass
class Start:
    """A fit's `model.init_from`, resolved once: fit records and checks it, its module loads it (no second read)."""

    source: Source
    mode: str = "bicubic"  # model.pos_resample
    new_head: bool = False  # model.new_head

    def check_data(self, in_chans: int) -> None:
        check_data(self.source, in_chans)

    def account(self, patch_size: int | None, img_size) -> dict:
        return account(self.source, patch_size, img_size, self.mode)

    def changed_since(self, record: dict) -> str | None:
        return changed_since(self.source, record)

    def load_into(self, vit) -> None:
        start_from(vit, self.source, self.mode, self.new_head)


def resolve(config, defaults, argv: list[str]) -> Start | None:
    """Fit's one resolution of `model.init_from` (its parsed config gets the source's architecture), or None."""
    source = adopt(config, defaults, argv)
    return Start(source, config["model.pos_resample"], config["model.new_head"]) if source else None


def adopt(config, defaults, argv: list[str]) -> Source | None:
    """Set the source's architecture into fit's parsed config (jsonargparse Namespace); the source, or None."""
    text = config["model.init_from"]
    if not text:
        return None
    source = read_source(text)
    keys = architecture_keys(source.options.get("arch", DEFAULT_ARCH))
    given = {k: config[f"model.{k}"] for k in keys
             if any(a.split("=", 1)[0] == f"--model.{k}" for a in argv) or config[f"model.{k}"] != defaults[f"model.{k}"]}
    for key, value in architecture(source, given).items():
        config[f"model.{key}"] = value
    return source


def changed_since(source: Source | None, record: dict) -> str | None:
    """One line when a finished run's recorded source (its sha256) is not the source as it is now; else None."""
    then = (record.get("init_from") or {}).get("sha256")
    if source is None or then is None or then == source.account.get("sha256"):
        return None
    return (f"model.init_from={source.account['source']} changed since this run finished "
            f"(sha256 {then[:12]}... recorded, {str(source.account.get('sha256'))[:12]}... now)")


def check_data(source: Source, in_chans: int) -> None:
    """The new data must have the source's channels: the patch embedding is reused as it is."""
    have = source.options.get("in_chans")
    if have is not None and have != in_chans:
        raise SourceError(f"model.init_from={source.account['source']}: the source takes {have}-channel images, "
                          f"the data has {in_chans} channels")


def conflicts(source: dict, given: dict) -> list[str]:
    """'key=given (source: value)' for each architecture option given that differs from the source's."""
    keys = architecture_keys(source.get("arch", DEFAULT_ARCH))
    default = ModelConfig(**{k: v for k, v in source.items() if k in keys or k in DATA_KEYS})
    out = []
    for key in keys:
        if key in RESIZED and pixel_patches(default):
            continue
        if key in given and key in source and _norm(given[key]) != _norm(getattr(default, key)):
            out.append(f"model.{key}={given[key]!r} (the source has {_norm(getattr(default, key))!r})")
    return out


def _hw(size) -> tuple | None:
    """An image size as (height, width)."""
    return None if size is None else (size, size) if isinstance(size, int) else tuple(size)


def _norm(value):
    return list(value) if isinstance(value, tuple) else value


def architecture(source: Source, given: dict) -> dict:
    """The source's architecture options (a conflicting given one is a SourceError naming both values)."""
    if found := conflicts(source.options, given):
        raise SourceError(f"model.init_from={source.account['source']}: {'; '.join(found)}: "
                          "the architecture comes from the source (leave these options out)")
    keys = architecture_keys(source.options.get("arch", DEFAULT_ARCH))
    options = {k: source.options[k] for k in keys if k in source.options}
    return {**options, **{k: given[k] for k in RESIZED if given.get(k) is not None}}


def account(source: Source, patch_size: int | None, img_size=None, mode: str = "bicubic") -> dict:
    """The record's account of the source, with what was done to its patch kernel when the patch size changed and
    to its position encoding when the patch grid changed (a new image size or patch size)."""
    out, old = dict(source.account), source.options.get("patch_size")
    patched = pixel_patches(source.options) and None not in (patch_size, old) and patch_size != old
    if patched:
        out["patch_resize"] = {"from": old, "to": patch_size, "kernel": "pi_resize (FlexiViT)"}
    was = source.options.get("img_size")
    sized = img_size is not None and was is not None and _hw(img_size) != _hw(was)
    if (patched or sized) and source.options.get("pos_encoding"):
        encoding = source.options["pos_encoding"]
        out["pos_resize"] = {"img_size": {"from": _norm(was), "to": _norm(img_size if sized else was)},
                             "pos_encoding": encoding, "done": resize_note(encoding, mode, source.options)}
    return out


@torch.no_grad()
def start_from(vit, source: Source, mode: str = "bicubic", new_head: bool = False) -> None:
    """Load the source's weights into the backbone built for the new data: encodings resampled, a zero head if needed."""
    old = build_backbone(**source.options)
    old.load_state_dict(source.state)
    old.resize(vit.config.img_size, mode=mode, patch_size=vit.config.patch_size)  # a new patch size: PI-resized kernel
    state = old.state_dict()
    head = {k for k in state if k.startswith("head.")}
    fresh_head = new_head or old.config.num_classes != vit.config.num_classes
    keep = {k: v for k, v in state.items() if not (fresh_head and k in head)}
    missing, unexpected = vit.load_state_dict(keep, strict=False)
    if unexpected or set(missing) - head:
        raise SourceError(f"model.init_from={source.account['source']}: weights do not fit: "
                          f"{sorted(set(missing) - head)[:3]} {unexpected[:3]}")
    if missing:  # the paper's transfer head: a zero classifier, so fine-tuning starts from uniform predictions
        last = [m for m in vit.head.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.zero_()
        last.bias.zero_()

