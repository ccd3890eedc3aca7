"""Run names as data: which options a trial's name shows and how, under each version of the naming rule.

The one owner of a trial's name: `trial_name`. A name is readable parts (the shared ones below, then each family's
own, from its registry entry) and a hash of every normalised value that changes training. A rule version keeps the
names it gave: a part joins only the versions from its `since` on, and a record stores the version it was named by
(fit's `run.naming`; a record without one was named by FIRST). Rule EARLIER is the ad hoc rule before defaults were
left out of the hash (every value hashed, over the options of that time): fit notes a run folder of that name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vit_lightning.core.identity import compose
from vit_lightning.core.names import SEED_KEY

EARLIER, FIRST, NAMING = 0, 1, 2  # the ad hoc rule before defaults; the rule of every committed run; the newest
VERSIONS = {
    EARLIER: "ad hoc names before defaults were left out of the hash: every value hashed",
    FIRST: "the readable parts (data, arch, variant, patch, encoding, injection, pooling, lr, seed) and the hash",
    NAMING: "also every swept key of the committed profiles in words: the task, the head, a family's own parts",
}
NAMING_KEY = "run.naming"  # fit's option for the version a run is named by (a sweep of a later rule passes it)
FIELD = re.compile(r"\{([\w.]*)(?::([^{}]*))?\}")  # {} the part's own value, {key} another option's, {:g} a format


@dataclass(frozen=True)
class NamePart:
    """One readable part of a name: an option's value as `form` writes it, or as `values` names it."""

    key: str  # the flat option it shows; absent or None: no part
    form: str | None = "{}"  # `{}` the value, `{key}` another option's (a list joined by '-'), `{:g}` a format
    values: dict = field(default_factory=dict)  # value -> text in place of form (None: no part at that value)
    since: int = FIRST  # the first rule version whose names show it
    replaces: str | None = None  # shown in that key's place when it has text (the hybrid stem for the patch size)

    def text(self, values: dict[str, Any]) -> str | None:
        """This part of a name over a trial's normalised values, or None."""
        value = values.get(self.key)
        if value is None or value == "" or isinstance(value, list):
            return None
        template = self.values.get(value, self.form) if _hashable(value) else self.form
        if template is None or (isinstance(value, bool) and value not in self.values):
            return None
        try:
            return FIELD.sub(lambda m: _render(value if not m.group(1) else values.get(m.group(1)), m.group(2)), template)
        except (TypeError, ValueError):  # a value the form cannot write (a `select:` lr): no part
            return None


def _hashable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _render(value: Any, spec: str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "-".join(map(str, value))
    return format(value, spec) if spec else str(value)


# Before a family's own parts, and after them
LEADING = (NamePart("model.init_from", "ft"), NamePart("data.name"), NamePart("data.task", since=NAMING),
           NamePart("model.arch"), NamePart("model.variant"), NamePart("model.patch_size", "p{}"))
TRAILING = (NamePart("model.pos_encoding"), NamePart("model.pos_injection"), NamePart("model.pooling"),
            NamePart("model.head", since=NAMING), NamePart("model.lr", "lr{:g}"), NamePart(SEED_KEY, "s{}"))
# shared options (model/config.py) added after the EARLIER rule: its names leave them out (a family's own options
# say it in their Option.named_since)
SHARED_AFTER_EARLIER = ("model.layer_scale", "model.qk_norm")
# options with one default for every family when runs were first named, and a family's own default since: an ad hoc
# run at its family's default hashes none of them, and the EARLIER rule reads the family's default as that one default
FAMILY_DEFAULT_SINCE = {"model.init": "paper"}
# left out of every rule's hash at these values: options added after runs were named (each family adds its own)
NEUTRAL = {"model.drop_path": 0}


def parts(version: int, family_parts: tuple[NamePart, ...] = ()) -> tuple[NamePart, ...]:
    """The parts of a rule version's names, in order: the shared ones around the families' (sorted by option)."""
    own = tuple(sorted(family_parts, key=lambda part: part.key))
    return tuple(part for part in (*LEADING, *own, *TRAILING) if part.since <= max(version, FIRST))


def check_version(version: Any) -> int:
    """A naming rule version as an int; ValueError naming the versions otherwise."""
    if isinstance(version, bool) or version not in VERSIONS:
        raise ValueError(f"{NAMING_KEY}={version!r} is not a naming rule version; choose from "
                         f"{', '.join(map(str, VERSIONS))}")
    return int(version)


def trial_text(values: dict[str, Any], version: int, family_parts: tuple[NamePart, ...], world: int, digest: str) -> str:
    """A trial's name: its readable parts under `version`, the world size beyond one process, the hash."""
    shown = parts(version, family_parts)
    texts = {part.key: part.text(values) for part in shown}
    for part in shown:
        if part.replaces and texts[part.key] is not None:
            texts[part.replaces], texts[part.key] = texts[part.key], None  # in the replaced part's place
    return compose([texts[part.key] for part in shown], world, digest)
