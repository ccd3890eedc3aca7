"""Rules of the code base read from its files: names live in their registries, functions stay short, --help lists
the choices the registries define."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vit_lightning.model import ENCODINGS, FAMILIES
from vit_lightning.model.position import NO_POSITION

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = ("model", "tests", "docs", "ablations")  # where encoding and family names may be written
LONGEST = 60  # lines a function may have


def name_patterns() -> list[re.Pattern]:
    """The registries' names as they would stand in a string: an encoding (or a part of a combined one) as a word,
    the encoding without position only as a whole string (the word 'none' is English too), a family's arch as a
    word not inside a dotted, dashed or underscored name (`vit-ablate`, `vit_lightning` are not the family)."""
    encodings = {part for name in ENCODINGS for part in name.split("+")} - {NO_POSITION}
    words = "|".join(map(re.escape, sorted(encodings, key=len, reverse=True)))
    return [re.compile(rf"(?<!\w)({words})(?!\w)"), re.compile(rf"^({re.escape(NO_POSITION)})$"),
            re.compile(rf"(?<![\w.-])({'|'.join(map(re.escape, FAMILIES))})(?![\w.-])")]


def named_in(source: str) -> list[tuple[int, str]]:
    """(line, name) for every registry name in a string literal (docstrings and f-string parts included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, m.group(1)) for pattern in name_patterns() for m in pattern.finditer(node.value)]
    return found


def package_files() -> list[Path]:
    """Every Python file of the repository outside the folders where names may be written."""
    return [p for p in sorted(REPO.rglob("*.py")) if not {".venv", ".git", *OUTSIDE} & set(p.relative_to(REPO).parts)
            and "egg-info" not in str(p)]


def test_the_scan_finds_a_name_in_any_string_and_none_only_whole():
    text = 'A = "peg"\nB = f"pos={x}: learned_1d+rope_axial"\n"""doc of relative_bias_2d."""\nC = "none"\n' \
           'D = "none of them"\nE = "vit-ablate fit"\nF = "arch=swin"\nG = "peg_kernels.png"\n# sincos_2d\n'
    assert sorted(named_in(text)) == [(1, "peg"), (2, "learned_1d"), (2, "rope_axial"), (3, "relative_bias_2d"),
                                      (4, "none"), (7, "swin")]


def test_no_encoding_or_family_name_is_written_outside_the_registries():
    """Figures, bench facts, notes and defaults get names from the encoding and family registries."""
    files = package_files()
    assert any(p.parts[-2:] == ("fit", "main.py") for p in files) and not any("model" in p.parts for p in files)
    named = [f"{p.relative_to(REPO)}:{line}: {name}" for p in files for line, name in named_in(p.read_text())]
    assert named == []


def option_patterns(names) -> list[re.Pattern]:
    """A family's own option as it would stand in a string: `model.<name>` (a flat key, an argv), `<name>=` (a message,
    an argv without the group), or the whole string (a getattr, a dict key)."""
    words = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    return [re.compile(rf"(?<![\w.])model\.({words})(?!\w)"), re.compile(rf"(?<![\w.-])({words})="),
            re.compile(rf"^({words})$")]


def options_named_in(source: str, names) -> list[tuple[int, str]]:
    """(line, option) for every family option of `names` written in a string literal of `source`."""
    patterns = option_patterns(names)
    return sorted({(node.lineno, m.group(1)) for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   for pattern in patterns for m in pattern.finditer(node.value)})


# Run naming names its options in model/ (model/naming.py): no option name outside it is allowed
NAMING: set[tuple[str, str]] = set()


def test_the_option_scan_finds_an_option_as_a_key_an_assignment_or_a_whole_string():
    text = 'A = "--model.stem=hybrid"\nB = f"pos_injection={x}"\nC = getattr(c, "reg_tokens", 0)\n' \
           'D = "the stem of a word"\nE = "Path(p).stem"\nF = "model.stems"\nG = "x.window_size=3"\n'
    assert options_named_in(text, {"stem", "pos_injection", "reg_tokens", "window_size"}) == [
        (1, "stem"), (2, "pos_injection"), (3, "reg_tokens")]


def test_no_family_option_is_written_outside_the_model():
    """A family's own options (the ViT's stem, injection, registers, ...; the Swin's window and shift) are named in
    model/ only: the code above it, figures included, asks the registry (a family's `describe` titles its runs)."""
    own = {name for family in FAMILIES.values() for name in family.options}
    named = [(str(p.relative_to(REPO)), line, name) for p in package_files() for line, name in
             options_named_in(p.read_text(), own)]
    assert any(p.parts[-2:] == ("viz", "run.py") for p in package_files())  # the figures modules are scanned too
    assert [f"{path}:{line}: model.{name}" for path, line, name in named if (path, name) not in NAMING] == []


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than LONGEST lines, decorators left out."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST]


def test_no_function_is_longer_than_sixty_lines():
    def source(lines: int) -> str:  # a method of `lines` lines, its def line included
        return "class A:\n    def g(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(lines - 1))

    assert long_functions(source(LONGEST)) == [] and long_functions(source(LONGEST + 1)) == [("g", LONGEST + 1)]
    long = [f"{p.relative_to(REPO)}: {name} ({lines} lines)" for p in sorted((REPO / "vit_lightning").rglob("*.py"))
            for name, lines in long_functions(p.read_text())]
    assert long == []


def help_of(text: str, option: str) -> str:
    """The help block of one option in `--help` output, on one line."""
    block = re.search(rf"^  --{re.escape(option)} .*?(?=^  --|\Z)", text, re.M | re.S)
    assert block, option
    return " ".join(block.group(0).split())


@pytest.mark.parametrize("option", ["model.arch", "model.variant", "model.pos_encoding", "model.pooling",
                                    "model.pos_injection", "model.head", "model.stem", "model.init", "data.name",
                                    "model.optimizer", "model.schedule", "model.pos_resample"])
def test_fit_help_lists_every_valid_choice(option, capsys):
    from vit_lightning.commands.fit.main import main
    from vit_lightning.data.datamodule import SOURCES
    from vit_lightning.model import HEADS, INJECTIONS, POOLINGS, STEMS
    from vit_lightning.model.layers import INITS
    from vit_lightning.run.module import OPTIMIZERS, SCHEDULES
    from vit_lightning.run.transfer import RESAMPLE

    registry = {"model.arch": FAMILIES, "model.pos_encoding": ENCODINGS, "model.pooling": POOLINGS,
                "model.pos_injection": INJECTIONS, "model.head": HEADS, "model.stem": STEMS, "model.init": INITS,
                "data.name": SOURCES, "model.optimizer": OPTIMIZERS, "model.schedule": SCHEDULES,
                "model.pos_resample": RESAMPLE,
                "model.variant": [v for family in FAMILIES.values() for v in family.variants]}[option]
    assert main(["--help"]) == 0
    text = help_of(capsys.readouterr().out, option)
    listed = text.split("Choices:", 1)[1]
    assert "position.ENCODINGS" not in text
    assert [name for name in registry if not re.search(rf"(?<![\w+]){re.escape(name)}(?![\w+])", listed)] == []
    if option in ("model.pos_encoding", "model.variant"):  # per family, where they differ
        assert all(f"{arch}:" in listed for arch in FAMILIES)
