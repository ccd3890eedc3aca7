"""The models the bench compares (ours with every encoding and pooling, timm's ViT) and their training FLOPs."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from vit_lightning.commands.bench.timing import Candidate
from vit_lightning.model import DEFAULT_ARCH, ENCODINGS, FAMILIES, POOLINGS, VARIANTS, ViT

NUM_CLASSES = 1000
ABSOLUTE = tuple(name for name, kind in ENCODINGS.items() if kind.absolute())  # added to the tokens, as the registry says
DEFAULT_ENCODING = FAMILIES[DEFAULT_ARCH].defaults["pos_encoding"]  # the paper's: the bench's reference and timm's twin
REFERENCE = f"ours {DEFAULT_ENCODING}/cls"  # the row the bench's bf16 and data-path numbers are measured on


@dataclass
class Subject:
    """A model at the bench's sizes and what it is: ours (with its encoding and pooling) or timm."""

    name: str
    kind: str  # "ours" | "timm"
    pos_encoding: str
    pooling: str
    model: nn.Module


def ours(variant: str, img_size: int, patch_size: int, pos_encoding: str = DEFAULT_ENCODING, pooling: str = "cls",
         in_chans: int = 3, num_classes: int = NUM_CLASSES) -> Subject:
    model = ViT(variant, img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
                pos_encoding=pos_encoding, pooling=pooling)
    return Subject(f"ours {pos_encoding}/{pooling}", "ours", pos_encoding, pooling, _visible_head(model))


def timm_vit(variant: str, img_size: int, patch_size: int) -> Subject | None:
    """timm's VisionTransformer at the same sizes (learned 1-D table, [class] token), or None without timm."""
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        return None
    depth, width, mlp_dim, heads = VARIANTS[variant]
    model = VisionTransformer(img_size=img_size, patch_size=patch_size, num_classes=NUM_CLASSES, embed_dim=width,
                              depth=depth, num_heads=heads, mlp_ratio=mlp_dim / width)
    return Subject("timm", "timm", DEFAULT_ENCODING, "cls", _visible_head(model))


# the other families the bench can pair with timm's model of the same size (a `--ARCH VARIANT` option each)
PAIRED = {name: family for name, family in FAMILIES.items() if name != DEFAULT_ARCH and family.timm_reference}


def family_pair(arch: str, variant: str, img_size: int, with_timm: bool) -> list[Subject]:
    """Our backbone of another family and (with timm) timm's model of the same sizes, at its default options."""
    family = FAMILIES[arch]
    model = family.cls(variant, img_size=img_size, num_classes=NUM_CLASSES)
    cfg = model.config
    out = [Subject(f"ours {arch}-{variant}", "ours", cfg.pos_encoding, cfg.pooling, _visible_head(model))]
    try:
        reference = family.timm_reference(variant, img_size, NUM_CLASSES) if with_timm else None
    except ImportError:
        return out
    if reference is not None:
        out.append(Subject(f"timm {arch}-{variant}", "timm", cfg.pos_encoding, cfg.pooling, _visible_head(reference)))
    return out


def paired_family(name: str) -> str | None:
    """The family of a subject named `ours ARCH-VARIANT` / `timm ARCH-VARIANT` (paired with timm's), else None."""
    arch = name.split(" ", 1)[-1].split("-", 1)[0]
    return arch if arch in PAIRED else None


def subjects(variant: str, img_size: int, patch_size: int, encodings: list[str] | bool, with_timm: bool,
             families: dict[str, str] | None = None, poolings: bool = True) -> list[Subject]:
    """ours with the default encoding and cls, timm, then with `encodings` (True: every one) each of them but the default with cls and
    (with `poolings`) every other pooling; for each `families` arch -> variant, our model of that size and timm's."""
    out = [ours(variant, img_size, patch_size)]
    for arch, size in (families or {}).items():
        out += family_pair(arch, size, img_size, with_timm)
    if with_timm:
        reference = timm_vit(variant, img_size, patch_size)
        if reference is None:
            print("timm is not installed: `pip install timm` to compare against it")
        else:
            out.append(reference)
    if encodings:
        chosen = ENCODINGS if encodings is True else encodings
        out += [ours(variant, img_size, patch_size, enc) for enc in chosen if enc != DEFAULT_ENCODING]
        out += [ours(variant, img_size, patch_size, pooling=p) for p in POOLINGS if p != "cls" and poolings]
    return out


def _visible_head(model: nn.Module) -> nn.Module:
    """Random head weights: the zero-initialised head would give all-zero logits and hide any mismatch of modes."""
    gen = torch.Generator().manual_seed(0)
    for module in model.head.modules():
        if isinstance(module, nn.Linear):
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * module.in_features**-0.5)
    return model


def candidates(subject: Subject, modes: list[tuple[str, bool]], device: torch.device,
               backend: str = "inductor") -> list[Candidate]:
    """One copy of the subject per (precision, compiled) mode, on the device, all with the same weights."""
    out = []
    for precision, compiled in modes:
        model = copy.deepcopy(subject.model).to(device).train()
        if compiled:
            model.compile(backend=backend)
        out.append(Candidate(subject.name, model, precision, compiled))
    return out


def train_flops_per_image(model: nn.Module, in_chans: int, img_size: int, device: torch.device) -> float:
    """FLOPs of one image's forward and backward (a multiply-add is 2 FLOPs, as in matmul peaks), attention included."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = copy.deepcopy(model).to(device).train()
    x = torch.randn(1, in_chans, img_size, img_size, device=device)
    # The math attention kernel is made of matmuls the counter sees (fused kernels are not counted).
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(x).float().sum().backward()
    return float(counter.get_total_flops())
