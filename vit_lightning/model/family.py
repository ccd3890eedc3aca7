"""Backbone families (ViT, Swin, ...): one registry entry each, and the contract every family's model meets.

An entry holds everything the rest of the package asks about a family: its class, its size presets, the
position encodings it accepts, what an unset (None) option means for it, the shared options it reads (`reads`), its
own options (declared by it, their choices checked by ModelConfig, the rest by the family's check), the capabilities
it offers beyond the contract (`offers`), its demo patch, its checks, its figures module with the words its figures
say of a run (`describe`, `figure_notes`) and its timm importer. Code outside `model/` looks a family up here and
never names one, nor one of its own options. The flat `--model.*` options stay one namespace: an
option read by other families only, set away from its default, is refused by one rule (`unread_error`; a shared
option the family does not read: config.unread_shared_error); a figure, metric or command needing a capability the
family does not offer is refused in one line (`Family.lacks`). A family outside the tree registers through an entry
point of the group ENTRY_POINTS, naming its Family; the registry loads them when it is first read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from vit_lightning.core.identity import digest, named_values, normalize
from vit_lightning.model.layers import keeping_attention
from vit_lightning.model.naming import (
    EARLIER,
    FIRST,
    NAMING_KEY,
    NEUTRAL,
    SHARED_AFTER_EARLIER,
    NamePart,
    check_version,
    trial_text,
)

DEFAULT_ARCH = "vit"  # model.arch when none is given (the family whose runs were named first)
ENTRY_POINTS = "vit_lightning.families"  # group of the entry points of families outside the tree: `arch = module:FAMILY`

# What a family may offer beyond the contract, each a method of its model; the family declares which (`offers`).
ATTENTION_MAPS = "attention_maps"  # attention_maps(x) -> per block (B, heads, T, T) (or per window) probabilities
TOKEN_GRID = "token_grid"  # its stem cuts images into config.patch_size patches on a grid: stem.grid_for(hw)
PRE_LOGITS = "pre_logits"  # pre_logits(x) -> (B, D') the head's hidden layer when it has one, what a probe reads
RESIZE = "resize"  # resize(img_size, *, mode, patch_size=None): its weights run at a new grid (transfer starts there)
CAPABILITIES = {ATTENTION_MAPS: "attention maps", TOKEN_GRID: "a token grid of patches", PRE_LOGITS: "pre-logits",
                RESIZE: "resizing to a new grid"}


@runtime_checkable
class Backbone(Protocol):
    """What every family's model offers (besides `config`, a ModelConfig, and `forward`: images -> logits).

    The rest (CAPABILITIES) a family declares in its entry's `offers`, and its model then has that method.
    """

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...  # (B, C, H, W) -> (B, D) pooled

    def no_weight_decay(self) -> set[str]: ...

    def num_params(self) -> int: ...


class Unsupported(ValueError):
    """A figure, metric or command needs a capability the run's family does not offer; one line."""


@dataclass(frozen=True)
class Option:
    """One of a family's own options (`--model.<name>`): the value that means "not used", its type, its help and,
    for a name from a registry, the values it accepts (checked by ModelConfig, listed by `--help` and the docs)."""

    default: Any
    type: Any
    help: str
    choices: tuple | None = None
    # the first naming rule whose ad hoc names hash it: an option added now joins after the earlier rule (EARLIER),
    # which leaves it out, so the name that rule gives an old run stays as it was
    named_since: int = FIRST


class BackboneParts:
    """The contract's methods (and pre-logits, for a head of layers.HEADS) that read the same for every family."""

    head: nn.Module

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, D) the representation a linear probe reads: the head's hidden layer if it has one."""
        feats = self.forward_features(x)
        return self.head[:-1](feats) if isinstance(self.head, nn.Sequential) else feats  # big_vision's pre_logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class BlockAttention:
    """ATTENTION_MAPS for a family whose `blocks` each hold an `attn` (layers.Attention): mix in before nn.Module."""

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every block (each block's own shape: (B, heads, T, T) or per window)."""
        with keeping_attention(self.blocks):
            self(x)
            return [block.attn.probs for block in self.blocks]


@dataclass(frozen=True)
class Family:
    """One backbone family: everything about it that code outside `model/` may ask."""

    name: str  # the value of model.arch
    cls: type[nn.Module]  # built as cls(**ModelConfig options); meets Backbone
    variants: Mapping  # size presets by model.variant
    encodings: tuple[str, ...]  # the model.pos_encoding values it accepts
    defaults: dict  # what an unset (None) option means for it: pooling, pos_encoding, patch_size
    architecture: tuple[str, ...]  # its options that fix the weights' shapes (a transfer source's are adopted)
    demo_patch: int  # fit's patch side when none is given
    check: Callable  # check(cfg): the family's own checks of a ModelConfig (fills variant sizes); raises ValueError
    viz: str | None = None  # module of its analysis figures (compute_numbers, draw); None: the shared figures only
    summary: Callable | None = None  # summary(config): a run in its figures' titles; None: arch, encoding, pooling
    figure_notes: dict = field(default_factory=dict)  # figure stem -> why its figures module leaves that figure out
    timm_loader: Callable | None = None  # load(model, timm_model): timm weights into ours
    timm_options: Callable | None = None  # options(timm_model): the ModelConfig options of our twin, or None
    timm_reference: Callable | None = None  # reference(variant, img_size, num_classes): timm's model of that size
    offers: frozenset = frozenset()  # its CAPABILITIES beyond the contract
    # the shared options (config.SharedOptions) it reads beyond config.CONTRACT_OPTIONS; any other, set away from
    # its default (the family's, else the shared one), is refused in one line (config.unread_shared_error)
    reads: frozenset = frozenset()
    options: dict = field(default_factory=dict)  # its own options, name -> Option (choices checked by ModelConfig)
    name_neutral: dict = field(default_factory=dict)  # own options left out of a trial's name at these values
    name_parts: tuple[NamePart, ...] = ()  # its own parts of a trial's name (Swin's "noshift"), model/naming.py

    def describe(self, config) -> str:
        """A run of this family in one line, as its figures title it: its own `summary`, else arch, encoding, pooling."""
        return self.summary(config) if self.summary else f"arch={self.name}, {config.pos_encoding}, {config.pooling}"

    def lacks(self, capability: str, needed_for: str) -> str | None:
        """One line when this family does not offer `capability` (CAPABILITIES), which `needed_for` needs; else None."""
        if capability in self.offers:
            return None
        return f"arch={self.name} does not offer {CAPABILITIES[capability]}, needed by {needed_for}"

    def require(self, capability: str, needed_for: str) -> None:
        """Unsupported (one line) when this family does not offer `capability`."""
        if line := self.lacks(capability, needed_for):
            raise Unsupported(line)


class Registry(Mapping):
    """The families by model.arch: those of the package, registered by their modules, and (read first) those of the
    installed distributions' entry points (ENTRY_POINTS)."""

    def __init__(self):
        self.entries: dict[str, Family] = {}
        self.points: dict[str, str] = {}  # arch -> the entry point (`module:attr`) that registered it
        self.loaded = False  # the entry points: loaded on the first read, again only when asked (`discover`)

    def _read(self) -> dict[str, Family]:
        if not self.loaded:
            self.loaded = True  # before loading: a family's module may read the registry as it registers
            try:
                discover(registry=self)
            except ValueError:
                self.loaded = False  # a bad entry point stays an error on every read until it is fixed
                raise
        return self.entries

    def __getitem__(self, name: str) -> Family:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


FAMILIES = Registry()


def register(family: Family) -> Family:
    """Add a family to the registry (each family's module registers itself; an entry point's family, `discover`)."""
    FAMILIES.entries[family.name] = family
    return family


def unregister(name: str) -> None:
    """Drop a family from the registry (a family an entry point added comes back only when `discover` runs again)."""
    FAMILIES.entries.pop(name, None)
    FAMILIES.points.pop(name, None)


def discover(group: str = ENTRY_POINTS, registry: Registry | None = None) -> list[str]:
    """Register the Family each entry point of `group` names (in `registry`, default FAMILIES), unless registered;
    the names added.

    A bad entry point (its module fails to import, it names no Family or a Family of another name, or one of a
    name registered already) is a ValueError of one line naming it.
    """
    registry = FAMILIES if registry is None else registry
    added = []
    for point in metadata.entry_points(group=group):
        where = f"entry point {point.name} = {point.value} (group {group}"
        where += f", distribution {point.dist.name})" if point.dist is not None else ")"
        if point.name in registry.entries:
            if registry.points.get(point.name) == point.value:
                continue  # loaded before
            raise ValueError(f"{where}: arch={point.name} is registered already, by "
                             f"{registry.points.get(point.name, registry.entries[point.name].cls.__module__)}")
        try:
            family = point.load()
        except Exception as err:  # noqa: BLE001  (whatever its import raises is the plugin's error, said in one line)
            raise ValueError(f"{where} does not load: {type(err).__name__}: {' '.join(str(err).split())}") from err
        if not isinstance(family, Family):
            raise ValueError(f"{where} names a {type(family).__name__}, not a vit_lightning.model.family.Family")
        if family.name != point.name:
            raise ValueError(f"{where} names the family arch={family.name}; an entry point's name is its family's arch")
        registry.entries[family.name], registry.points[family.name] = family, point.value
        added.append(family.name)
    return added


def family_of(model: nn.Module) -> Family:
    """The family a built backbone belongs to."""
    return FAMILIES[model.config.arch]


def unread_error(arch: str, values: dict) -> str | None:
    """The first option (of `values`) that only other families declare and that differs from its default, in one
    line, or None."""
    own = FAMILIES[arch].options
    for other in FAMILIES.values():
        for name, option in other.options.items():
            value = values.get(name, option.default)
            if name not in own and (tuple(value) if isinstance(value, list) else value) != option.default:
                return f"model.{name}={value!r} applies to arch={other.name} only, not arch={arch}"
    return None


def family_options() -> dict[str, Option]:
    """Every family's own options by name (a name two families declare is one option: the first declaration)."""
    out: dict[str, Option] = {}
    for family in FAMILIES.values():
        for name, option in family.options.items():
            out.setdefault(name, option)
    return out


SHARED_ARCHITECTURE = ("arch", "variant", "patch_size", "width", "pos_encoding", "pooling", "head", "layer_scale",
                       "qk_norm")


def architecture_keys(arch: str) -> tuple[str, ...]:
    """The options that fix a model's architecture in family `arch` (unknown arch: the shared ones)."""
    family = FAMILIES.get(arch)
    return SHARED_ARCHITECTURE + (family.architecture if family else ())


def trial_name(params: dict, world: int = 1, defaults: dict | None = None, version: int | None = None) -> str:
    """A trial's name (the one owner): the readable parts of its rule version (`version`, else the params'
    run.naming, else FIRST), every family's name-neutral values left out of the hash (`defaults`: identity.digest)."""
    version = check_version(normalize(params.get(NAMING_KEY, FIRST)) if version is None else version)  # W&B: "2"
    values = named_values(params, world, name_neutral())
    return trial_text(values, version, name_parts(), world, digest(values, defaults))


def name_neutral() -> dict:
    """Flat option -> value left out of a trial's name hash: options added after runs were named."""
    out = {"model.arch": DEFAULT_ARCH, **NEUTRAL}
    for family in FAMILIES.values():
        out.update({f"model.{k}": v for k, v in family.name_neutral.items()})
    return out


def name_parts() -> tuple[NamePart, ...]:
    """Every family's own name parts (an option two families declare: the first declaration)."""
    out: dict[str, NamePart] = {}
    for family in FAMILIES.values():
        for part in family.name_parts:
            out.setdefault(part.key, part)
    return tuple(out.values())


def added_after_earlier() -> set[str]:
    """The flat model options the EARLIER rule's names leave out: every family's options that joined after it."""
    return set(SHARED_AFTER_EARLIER) | {f"model.{k}" for family in FAMILIES.values()
                                        for k, option in family.options.items() if option.named_since > EARLIER}
