"""What `vit-ablate fit` checks in its settings before it builds anything, and how it says so (one line each)."""

from __future__ import annotations

import logging
import re
import sys
import warnings

from lightning.fabric.utilities.rank_zero import rank_zero_only

from vit_lightning.core.checks import range_error, suggest
from vit_lightning.run import hyperband


def _reruns_this_fit(argv: list[str]) -> bool:
    """Lightning's DDP launcher starts the other ranks by running this process's command line again."""
    return sys.argv[1:] in (argv, ["fit", *argv])


def settings_error(config: dict) -> str | None:
    """Why flat fit settings cannot make a run (a budget that trains nothing, no DDP timeout), or None."""
    for key in ("trainer.max_epochs", "trainer.max_steps", "trainer.limit_train_batches"):
        if config.get(key) == 0 and not isinstance(config.get(key), bool):
            return f"{key}=0 trains nothing; give a positive number"
    if error := hyperband.option_error(config.get(hyperband.OPTION)):
        return error
    for key, bounds in SETTING_RANGES.items():
        if (value := config.get(key)) is not None and (error := range_error(key, value, *bounds)):
            return error
    return None


# (low, high, low open, high open, integer, what) of fit's own numbers and the trainer's that Lightning checks late
SETTING_RANGES = {
    "run.ddp_timeout_s": (0, 1e7, True, False, False, "seconds"),
    "run.shuffle_perms": (0, 1000, False, False, True),
    "run.fewshot_every": (0, 1e6, False, False, True),
    "trainer.gradient_clip_val": (0, 1e6, False, False, False, "a gradient norm (0: no clipping)"),
}


def unknown_options(message: str, known) -> str | None:
    """jsonargparse's `unrecognized arguments: --a --b` as one line naming each with its nearest options."""
    head, sep, rest = message.partition("unrecognized arguments:")
    if not sep:
        return None
    names = [arg[2:].split("=")[0] for arg in rest.split() if arg.startswith("--")]
    if not names:
        return None
    return "; ".join(f"unknown option --{name} ({suggest(name, known)})" for name in names)


def linked_option(message: str) -> str | None:
    """jsonargparse's failure to link a data option into a model option given too (`--model.img_size=56`: the
    model's is the data's), in the words it uses for the others; None for any other message."""
    if found := re.match(r"argument (data\.\w+) --> (model\.\w+):", message):
        return f'Linked "{found[2]}" must be given via "{found[1]}".'
    return None


def _say(line: str) -> None:
    if rank_zero_only.rank == 0:
        print(line, flush=True)


def _warn(line: str) -> None:
    if rank_zero_only.rank == 0:
        print(line, file=sys.stderr, flush=True)


def _error(line: str, code: int) -> int:
    _warn(f"vit-ablate fit: error: {line}")
    return code


def _quiet() -> None:
    """Silence advice that does not apply: in-memory data needs no workers; tiny test runs log rarely."""
    for pattern in (".*does not have many workers.*", ".*smaller than the logging interval.*",
                    ".*Checkpoint directory .* exists and is not empty.*", r".*isinstance\(treespec, LeafSpec\).*",
                    ".*The `srun` command is available on your system but is not used.*"):  # we launch it ourselves
        warnings.filterwarnings("ignore", message=pattern)
    # "Seed set to N" would otherwise stand before a bad option's one-line error; the record keeps the seed.
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
