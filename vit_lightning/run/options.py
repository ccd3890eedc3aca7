"""The values each `vit-ablate fit` option accepts, read from the registries that check them.

`fit --help` ends each such option's help with them, and `vit-ablate docs` puts them in the options reference;
the check itself stays where each registry is read (the config, the module, the data).
"""

from __future__ import annotations

from vit_lightning.data.datamodule import AUGMENT_ON, DATASETS, DECODE_ON, RESIZE
from vit_lightning.data.glyphs import TASKS, VERSIONS
from vit_lightning.model import FAMILIES, HEADS, POOLINGS
from vit_lightning.model.family import family_options
from vit_lightning.model.layers import INITS
from vit_lightning.run.module import OPTIMIZERS, SCHEDULES
from vit_lightning.run.transfer import RESAMPLE


def option_choices() -> dict[str, tuple | dict[str, tuple]]:
    """Option -> the values it accepts, or family -> values where the family decides."""
    return {
        "model.arch": tuple(FAMILIES),
        "model.variant": {f.name: tuple(f.variants) for f in FAMILIES.values()},
        "model.pos_encoding": {f.name: tuple(f.encodings) for f in FAMILIES.values()},
        "model.pooling": tuple(POOLINGS), "model.head": tuple(HEADS), "model.init": INITS,
        **{f"model.{name}": option.choices for name, option in family_options().items() if option.choices},
        "model.optimizer": OPTIMIZERS, "model.schedule": SCHEDULES, "model.pos_resample": RESAMPLE,
        "data.name": DATASETS, "data.task": TASKS, "data.resize": RESIZE, "data.augment_on": AUGMENT_ON,
        "data.decode_on": DECODE_ON, "data.glyph_version": VERSIONS,
    }


def choices_text(choices: tuple | dict[str, tuple], quote: str = "") -> str:
    """`a, b, c`, or `<family>: a, b; <family>: a, c` for choices per family; each value between `quote`s."""
    def names(values) -> str:
        return ", ".join(f"{quote}{v}{quote}" for v in values)

    if isinstance(choices, dict):
        return "; ".join(f"{family}: {names(values)}" for family, values in choices.items())
    return names(choices)


def help_suffix(option: str) -> str:
    """What `fit --help` adds to an option's help: its choices, or nothing."""
    choices = option_choices().get(option)
    return f" Choices: {choices_text(choices)}." if choices else ""
