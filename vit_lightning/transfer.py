"""Start from a trained model, the paper's transfer protocol (section 3.2).

A source is a run directory, a `vit-ablate fit` checkpoint, `timm:NAME` (weights downloaded by timm)
or `timm:NAME@FILE` (a local file holding that timm model's state dict). The new run takes the
source's architecture, resamples each position encoding to the new patch grid the way that encoding
must be resampled, and gets the paper's zero-initialised head when the classes change (or when asked).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from vit_lightning.bookkeeping import one_line
from vit_lightning.model.config import VARIANTS, ViTConfig
from vit_lightning.rundir import RunDirError, checkpoint_path, checkpoint_record, data_options, read_checkpoint

# ViTConfig fields that fix the architecture: taken from the source, a different one given is an error
ARCH_KEYS = ("arch", "variant", "patch_size", "width", "depth", "heads", "mlp_dim", "pos_encoding", "pos_injection",
             "pooling", "stem", "hybrid_layers", "hybrid_width", "head")
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
        record = checkpoint_record(ckpt)
        state = read_checkpoint(ckpt)
    except RunDirError as error:
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
    from vit_lightning.model.timm_weights import _head, timm_pooling

    embed, block = vit.patch_embed, vit.blocks[0]
    if type(embed).__name__ != "PatchEmbed":
        raise ValueError(f"only patch-stem timm ViTs start a run here, not {type(embed).__name__}")
    sizes = (len(vit.blocks), vit.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads)
    variant = next((name for name, size in VARIANTS.items() if size == sizes), "micro")
    depth, width, mlp_dim, heads = sizes
    return {"arch": "vit", "variant": variant, "depth": depth, "width": width, "mlp_dim": mlp_dim, "heads": heads,
            "patch_size": embed.patch_size[0], "img_size": list(embed.img_size), "in_chans": embed.proj.in_channels,
            "num_classes": vit.num_classes, "pooling": timm_pooling(vit)[0], "head": _head(vit),
            "pos_encoding": "none" if vit.pos_embed is None else "learned_1d", "pos_injection": "stem",
            "stem": "patch"}


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
        if key in given and key in source and _norm(given[key]) != _norm(getattr(default, key)):
            out.append(f"model.{key}={given[key]!r} (the source has {_norm(getattr(default, key))!r})")
    return out


def _norm(value):
    return list(value) if isinstance(value, tuple) else value


def architecture(source: Source, given: dict) -> dict:
    """The source's architecture options (a conflicting given one is a SourceError naming both values)."""
    if found := conflicts(source.options, given):
        what = "a different patch size cannot reuse the patch embedding; " if any(
            f.startswith("model.patch_size=") for f in found) else ""
        raise SourceError(f"model.init_from={source.account['source']}: {what}{'; '.join(found)}: "
                          "the architecture comes from the source (leave these options out)")
    return {k: source.options[k] for k in ARCH_KEYS if k in source.options}


@torch.no_grad()
def start_from(vit, source: Source, mode: str = "bicubic", new_head: bool = False) -> None:
    """Load the source's weights into `vit` (built for the new data): encodings resampled, a zero head if needed."""
    from vit_lightning.model import ViT

    old = ViT(**source.options)
    old.load_state_dict(source.state)
    old.resize(vit.config.img_size, mode)
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

