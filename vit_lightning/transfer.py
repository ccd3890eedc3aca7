"""Start from a trained model, the paper's transfer protocol (section 3.2).

A source is a run directory, a `vit-ablate fit` checkpoint, `timm:NAME` (weights downloaded by timm)
or `timm:NAME@FILE` (a local file holding that timm model's state dict). The new run takes the
source's architecture (a patch stem's patch size may change: its kernel is PI-resized, see model/flexi.py),
resamples each position encoding to the new patch grid the way that encoding must be resampled, and gets
the paper's zero-initialised head when the classes change (or when asked).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, fields
from pathlib import Path

import lightning.pytorch as pl
import torch
from typing_extensions import override

from vit_lightning.bookkeeping import BEST_METRIC, one_line
from vit_lightning.model.config import VARIANTS, ViTConfig
from vit_lightning.record import RunRecord
from vit_lightning.trained import TrainedError, checkpoint_path, data_options, read_checkpoint, read_run_record

# ViTConfig fields that fix the architecture: taken from the source, a different one given is an error
ARCH_KEYS = ("arch", "variant", "patch_size", "width", "depth", "heads", "mlp_dim", "pos_encoding", "pos_injection",
             "pooling", "stem", "hybrid_layers", "hybrid_width", "head", "layer_scale", "reg_tokens", "qk_norm",
             "pos_embed_class")
RESIZED = ("patch_size",)  # architecture options a patch-stem source may change: its kernel is PI-resized (FlexiViT)
DATA_KEYS = ("img_size", "in_chans", "num_classes")  # from the new data; img_size and num_classes may change
RESAMPLE = ("bicubic", "bilinear", "nearest")  # model.pos_resample: how learned tables are interpolated
TIMM = "timm:"


class SourceError(ValueError):
    """A source that cannot start a run; one line naming the problem."""


@dataclass
class Source:
    """A trained backbone: its ViTConfig options, its ViT state dict and the record's account of where it came from."""

    options: dict  # ViTConfig fields of the source (architecture and the data it saw)
    state: dict[str, torch.Tensor]  # ViT parameter names -> tensors
    account: dict  # {"source", "trial" | "file", "sha256", "config"} for the run record
    data: dict | None = None  # the data module options the source trained with (None: not known)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=2)  # fit reads it to build the options, then again to load the weights
def read_source(text: str) -> Source:
    """The source named by `text`; SourceError (one line) when it is missing, unfinished or foreign."""
    if text.startswith(TIMM):
        return _timm_source(text[len(TIMM):])
    ckpt = checkpoint_path(Path(text))
    try:
        record = read_run_record(ckpt) if ckpt.is_file() else None
        state = read_checkpoint(ckpt)
    except TrainedError as error:
        raise SourceError(f"model.init_from={text}: {error}") from None
    if record is not None and record.get("status") != "completed":
        raise SourceError(f"model.init_from={text}: the run did not finish (status {record.get('status')!r}); "
                          "finish it first (the same fit command resumes it)")
    names = {f.name for f in fields(ViTConfig)}
    options = {k: v for k, v in state["hyper_parameters"].items() if k in names}
    if options.get("arch", "vit") != "vit":  # Swin's windows and merged stages do not follow a new grid here
        raise SourceError(f"model.init_from={text}: a {options['arch']} source cannot start a run; "
                          "only ViT sources (runs, checkpoints, timm ViTs) can")
    weights = {k[len("model."):]: v for k, v in state["state_dict"].items() if k.startswith("model.")}
    account = {"source": text, "file": str(ckpt), "sha256": sha256(ckpt), "trial": (record or {}).get("trial"),
               "config": (record or {}).get("config") or options, "metrics": (record or {}).get("metrics") or {}}
    return Source(options, weights, account, data_options(state, record))


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
        options = timm_options(reference)
        from vit_lightning.model import ViT, load_timm_weights

        ours = ViT(**options)
        load_timm_weights(ours, reference)
    except (TypeError, ValueError) as error:
        raise SourceError(f"{where}: {one_line(error)}") from None
    account = {"source": f"timm:{spec}", "file": file or None, "sha256": sha256(Path(file)) if file else None,
               "trial": None, "config": {"timm": name, **options}}
    return Source(options, ours.state_dict(), account)


def timm_options(vit) -> dict:
    """The ViTConfig options that build our twin of a timm VisionTransformer (patch stem only)."""
    from vit_lightning.model.timm_weights import _head, timm_parts, timm_pooling

    embed, block = vit.patch_embed, vit.blocks[0]
    if type(embed).__name__ != "PatchEmbed":
        raise ValueError(f"only patch-stem timm ViTs start a run here, not {type(embed).__name__}")
    sizes = (len(vit.blocks), vit.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads)
    variant = next((name for name, size in VARIANTS.items() if size == sizes), "micro")
    depth, width, mlp_dim, heads = sizes
    return {"arch": "vit", "variant": variant, "depth": depth, "width": width, "mlp_dim": mlp_dim, "heads": heads,
            "patch_size": embed.patch_size[0], "img_size": list(embed.img_size), "in_chans": embed.proj.in_channels,
            "num_classes": vit.num_classes, "pooling": timm_pooling(vit)[0], "head": _head(vit), "pos_injection": "stem",
            **timm_parts(vit)}


def adopt(config, defaults, argv: list[str]) -> Source | None:
    """Set the source's architecture into fit's parsed config (jsonargparse Namespace); the source, or None."""
    text = config["model.init_from"]
    if not text:
        return None
    if config["model.pos_resample"] not in RESAMPLE:
        raise SourceError(f"unknown model.pos_resample={config['model.pos_resample']!r}; choose from: "
                          f"{', '.join(RESAMPLE)}")
    source = read_source(text)
    given = {k: config[f"model.{k}"] for k in ARCH_KEYS
             if any(a.split("=", 1)[0] == f"--model.{k}" for a in argv) or config[f"model.{k}"] != defaults[f"model.{k}"]}
    for key, value in architecture(source, given).items():
        config[f"model.{key}"] = value
    return source


def check_data(source: Source, in_chans: int) -> None:
    """The new data must have the source's channels: the patch embedding is reused as it is."""
    have = source.options.get("in_chans")
    if have is not None and have != in_chans:
        raise SourceError(f"model.init_from={source.account['source']}: the source takes {have}-channel images, "
                          f"the data has {in_chans} channels")


def conflicts(source: dict, given: dict) -> list[str]:
    """'key=given (source: value)' for each architecture option given that differs from the source's."""
    default = ViTConfig(**{k: v for k, v in source.items() if k in ARCH_KEYS or k in DATA_KEYS})
    out = []
    for key in ARCH_KEYS:
        if key in RESIZED and default.stem == "patch":
            continue
        if key in given and key in source and _norm(given[key]) != _norm(getattr(default, key)):
            out.append(f"model.{key}={given[key]!r} (the source has {_norm(getattr(default, key))!r})")
    return out


def _norm(value):
    return list(value) if isinstance(value, tuple) else value


def architecture(source: Source, given: dict) -> dict:
    """The source's architecture options (a conflicting given one is a SourceError naming both values)."""
    if found := conflicts(source.options, given):
        raise SourceError(f"model.init_from={source.account['source']}: {'; '.join(found)}: "
                          "the architecture comes from the source (leave these options out)")
    options = {k: source.options[k] for k in ARCH_KEYS if k in source.options}
    return {**options, **{k: given[k] for k in RESIZED if given.get(k) is not None}}


def account(source: Source, patch_size: int | None) -> dict:
    """The record's account of the source, with what was done to its patch kernel when the patch size changed."""
    old = source.options.get("patch_size")
    if patch_size is None or old is None or patch_size == old or source.options.get("stem", "patch") != "patch":
        return source.account
    return {**source.account, "patch_resize": {"from": old, "to": patch_size, "kernel": "pi_resize (FlexiViT)"}}


@torch.no_grad()
def start_from(vit, source: Source, mode: str = "bicubic", new_head: bool = False) -> None:
    """Load the source's weights into `vit` (built for the new data): encodings resampled, a zero head if needed."""
    from vit_lightning.model import ViT

    old = ViT(**source.options)
    old.load_state_dict(source.state)
    old.resize(vit.config.img_size, mode, vit.config.patch_size)  # a new patch size: the kernel PI-resized
    state = old.state_dict()
    check_data(source, vit.config.in_chans)
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
            from vit_lightning.evaluate import accuracy

            loader = trainer.datamodule.val_dataloader()
            limit = trainer.limit_val_batches
            count = limit if isinstance(limit, int) else math.ceil(limit * len(loader))
            batches = (batch for _, batch in zip(range(count), loader))
            self.metrics["transfer/start_acc"] = accuracy(pl_module.model, batches)["val/acc"]
        for callback in trainer.callbacks:
            if isinstance(callback, RunRecord):
                callback.add_metrics(self.metrics)
