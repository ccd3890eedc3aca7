"""The argparse parser of every `vit-ablate` command but fit: a bad option or value is one line, exit 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

from vit_lightning.core.checks import close_matches


class CommandParser(argparse.ArgumentParser):
    """argparse whose errors are one line, `vit-ablate CMD: error: PROBLEM`, without the usage block (--help has it);
    an unknown option is answered with the nearest option names, an invalid value with the valid choices."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # option names are exact, as in fit: `--shot` is not `--shots`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse's own text names the option and, for a choice, the valid choices; only the usage block goes
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        self.refuse(extra)
        return parsed

    def refuse(self, extra: list[str]) -> None:
        """Stop with one line naming each argument of `extra` (those no option takes), if there is one."""
        # a word right after an unknown `--name` is most likely its value, not an argument of its own
        named = [arg for i, arg in enumerate(extra) if arg.startswith("-") or i == 0 or not self._bare(extra[i - 1])]
        if named:
            self.error("; ".join(self.unknown(arg) for arg in named))

    @staticmethod
    def _bare(arg: str) -> bool:
        return arg.startswith("-") and "=" not in arg

    def unknown(self, arg: str) -> str:
        """What is wrong with one argument no option takes, with the nearest option names."""
        if not arg.startswith("-") or arg == "-":
            return f"unexpected argument {arg!r}"
        name = arg.split("=", 1)[0]
        options = self.long_options()
        if close := close_matches(name, options, cutoff=0.6):
            return f"unknown option {name} (did you mean {', '.join(close)}?)"
        return f"unknown option {name} (options: {', '.join(options)})"

    def long_options(self) -> list[str]:
        """This command's `--name` options, sorted (--help left out: no misspelling is meant as it)."""
        return sorted({s for action in self._actions for s in action.option_strings if s.startswith("--")} - {"--help"})
