"""The linter configured in pyproject.toml passes on the whole repository (the test command runs it)."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: pip install -e '.[dev]'"
    done = subprocess.run([ruff, "check", "--no-cache", str(REPO)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


PUBLIC = {("os", "_exit")}  # documented names that start with an underscore


def _private_uses(path: Path) -> list[str]:
    """`x._name` on anything but self/cls/our own imports, and `from lib import _name`, in one module."""
    import ast

    tree = ast.parse(path.read_text())
    own = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
           and (node.level or (node.module or "").startswith("vit_lightning")) for a in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if base not in ("self", "cls", *own) and (base, node.attr) not in PUBLIC:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("vit_lightning"):
            found += [f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if a.name.startswith("_")]
    return found


def test_other_libraries_private_api_is_used_only_in_compat_and_those_libraries_have_upper_bounds():
    import tomllib

    outside = [use for path in sorted((REPO / "vit_lightning").rglob("*.py")) if "compat" not in path.parts
               for use in _private_uses(path)]
    assert outside == [], "private API of another library outside vit_lightning/compat/: " + "; ".join(outside)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for library in ("torch", "torchvision", "lightning", "wandb"):  # the libraries compat/ holds a module for
        assert (REPO / "vit_lightning" / "compat" / f"{library}.py").is_file()
        [spec] = [d for d in deps if d.split(">")[0].split("<")[0].strip() == library]
        assert "<" in spec, f"{spec}: compat/{library}.py uses its private API, so it needs an upper bound"


def test_every_lightning_hook_we_define_says_override():
    """A misspelled hook would never run; @override makes a type checker (and this test) catch the name."""
    import inspect

    import lightning.pytorch as pl
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import Logger

    from vit_lightning.analysis import fewshot
    from vit_lightning.commands.fit import main as train
    from vit_lightning.data import datamodule as data
    from vit_lightning.run import callbacks, loggers, module, record, rundir, transfer

    bases = (pl.Callback, pl.LightningModule, pl.LightningDataModule, Logger, LightningCLI, rundir.TorchCheckpointIO)
    classes = [c for m in (callbacks, data, fewshot, loggers, module, record, rundir, train, transfer) for _, c in
               inspect.getmembers(m, inspect.isclass) if issubclass(c, bases) and c.__module__ == m.__name__]
    assert len(classes) >= 14
    missing = []
    for cls in classes:
        for name, value in vars(cls).items():
            function = value.fget if isinstance(value, property) else value
            if name.startswith("__") or not inspect.isfunction(function):
                continue
            inherited = any(hasattr(base, name) for base in cls.__mro__[1:])
            marked = getattr(function, "__override__", False) or _decorated_override(cls, name)
            if inherited and not marked:
                missing.append(f"{cls.__name__}.{name}")
            if marked and not inherited:
                missing.append(f"{cls.__name__}.{name} (says override, overrides nothing)")
    assert missing == []


def _decorated_override(cls, name: str) -> bool:
    """@override above @property cannot mark the property object; read the decorator from the source."""
    import inspect

    lines = inspect.getsource(cls).splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip().startswith(f"def {name}(")), None)
    while at is not None and at > 0 and lines[at - 1].strip().startswith("@"):
        if lines[at - 1].strip() == "@override":
            return True
        at -= 1
    return False
