"""Backbone families (ViT, Swin, ...): one registry entry each, and the contract every family's model meets.

An entry holds everything the rest of the package asks about a family: its class, its size presets, the
position encodings it accepts, what an unset (None) option means for it, the options only it reads, its demo
patch, its checks, its figures module and its timm importer. Code outside `model/` looks a family up here
and never names one. The flat `--model.*` options stay one namespace: an option read by other families only,
set away from its default, is refused by one rule (`unread_error`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from vit_lightning.identity import run_name
from vit_lightning.model.layers import keeping_attention

DEFAULT_ARCH = "vit"  # model.arch when none is given (the family whose runs were named first)


@runtime_checkable
class Backbone(Protocol):
    """What every family's model offers (besides `config`, a ViTConfig, and `forward`: images -> logits)."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...  # (B, C, H, W) -> (B, D) pooled

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor: ...  # (B, C, H, W) -> (B, D') what a probe reads

    def resize(self, img_size, *, mode: str = "bicubic", window_size: int | None = None) -> None: ...

    def attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]: ...

    def no_weight_decay(self) -> set[str]: ...

    def num_params(self) -> int: ...


class BackboneParts:
    """The contract's methods that read the same for every family (mix in before nn.Module)."""

    head: nn.Module

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, D) the representation a linear probe reads: the head's hidden layer if it has one."""
        feats = self.forward_features(x)
        return self.head[:-1](feats) if isinstance(self.head, nn.Sequential) else feats  # big_vision's pre_logits

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every block (each block's own shape: (B, heads, T, T) or per window)."""
        with keeping_attention(self.blocks):
            self(x)
            return [block.attn.probs for block in self.blocks]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


@dataclass(frozen=True)
class Family:
    """One backbone family: everything about it that code outside `model/` may ask."""

    name: str  # the value of model.arch
    cls: type[nn.Module]  # built as cls(**ViTConfig options); meets Backbone
    variants: Mapping  # size presets by model.variant
    encodings: tuple[str, ...]  # the model.pos_encoding values it accepts
    defaults: dict  # what an unset (None) option means for it: pooling, pos_encoding, patch_size
    reads: dict  # the options only this family reads, with the value that means "not used" (ViTConfig's default)
    architecture: tuple[str, ...]  # its options that fix the weights' shapes (a transfer source's are adopted)
    demo_patch: int  # fit's patch side when none is given
    check: Callable  # check(cfg): the family's own checks of a ViTConfig (fills variant sizes); raises ValueError
    viz: str | None = None  # module of its analysis figures (compute, draw); None: the ViT's
    timm_loader: Callable | None = None  # load(model, timm_model): timm weights into ours
    timm_options: Callable | None = None  # options(timm_model): the ViTConfig options of our twin, or None
    timm_reference: Callable | None = None  # reference(variant, img_size, num_classes): timm's model of that size
    transfers: bool = False  # its weights can start a run at another resolution (model.init_from)
    name_neutral: dict = field(default_factory=dict)  # own options left out of a trial's name at these values
    name_parts: dict = field(default_factory=dict)  # option -> {value: name part} (Swin's "noshift")


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family to the registry (each family's module registers itself)."""
    FAMILIES[family.name] = family
    return family


def family_of(model: nn.Module) -> Family:
    """The family a built backbone belongs to."""
    return FAMILIES[model.config.arch]


def unread_error(cfg) -> str | None:
    """The first option that only other families read and that differs from its default, in one line, or None."""
    own = FAMILIES[cfg.arch].reads
    for other in FAMILIES.values():
        for name, unused in other.reads.items():
            value = getattr(cfg, name)
            if name not in own and (tuple(value) if isinstance(value, list) else value) != unused:
                return f"model.{name}={value!r} applies to arch={other.name} only, not arch={cfg.arch}"
    return None


SHARED_ARCHITECTURE = ("arch", "variant", "patch_size", "width", "pos_encoding", "pooling", "head", "layer_scale",
                       "qk_norm")


def architecture_keys(arch: str) -> tuple[str, ...]:
    """The options that fix a model's architecture in family `arch` (unknown arch: the shared ones)."""
    family = FAMILIES.get(arch)
    return SHARED_ARCHITECTURE + (family.architecture if family else ())


def trial_name(params: dict, world: int = 1, defaults: dict | None = None) -> str:
    """identity.run_name with every family's name-neutral values and readable parts (`defaults`: see there)."""
    return run_name(params, world, name_neutral(), name_parts(), defaults)


def name_neutral() -> dict:
    """Flat option -> value left out of a trial's name hash: options added after runs were named."""
    out = {"model.arch": DEFAULT_ARCH, "model.drop_path": 0}
    for family in FAMILIES.values():
        out.update({f"model.{k}": v for k, v in family.name_neutral.items()})
    return out


def name_parts() -> dict:
    """Flat option -> {value: readable name part}, from every family."""
    return {f"model.{k}": v for family in FAMILIES.values() for k, v in family.name_parts.items()}
