"""The layer rule (vit_lightning/core/floors.py): no import reaches a floor above its module's, and no import cycle.

Every import statement counts, function-local ones included; imports by name at run time (importlib) are
named in ROUTES. A parent package's __init__, which Python runs before any of its modules, is no edge.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

from vit_lightning import cli
from vit_lightning.commands.sweep import forkserver
from vit_lightning.core import floors
from vit_lightning.model.family import FAMILIES

PACKAGE = Path(floors.__file__).parent.parent  # vit_lightning/, floors.py sits in its core/
ABLATIONS = PACKAGE.parent / "ablations"
# Imports by name at run time, which ast cannot see: module -> the modules it imports that way
ROUTES = {
    "vit_lightning.cli": tuple(target.split(":")[0] for target, _ in cli.COMMANDS.values()),
    "vit_lightning.ablation": ("vit_lightning.model",),  # load() runs ablations/*.py, which import the model
    "vit_lightning.commands.sweep.forkserver": tuple(m for m in forkserver.PRELOAD if m.startswith("vit_lightning")),
    "vit_lightning.commands.bench.trial_split": (),  # times torch's Adam, found by name
    "vit_lightning.commands.viz.run": tuple(family.viz for family in FAMILIES.values() if family.viz),  # a family's figures
}
BY_NAME = ("import_module(", "spec_from_file_location(", "find_spec(", "__import__(")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(path: Path, root: Path) -> set[str]:
    """The modules `path` imports (every statement, at any depth), as dotted names."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module mod
            out |= {f"{base}.{a.name}" if is_module(f"{base}.{a.name}", root) else base for a in node.names}
    return out


def graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (ROUTES included)."""
    ours = root.name
    edges = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        found = {m for m in imported(path, root) if m == ours or m.startswith(ours + ".")}
        edges[name] = (found | set(ROUTES.get(name, ()))) - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: groups of modules each reachable from the others."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {m: reach(m) for m in edges}
    groups = {tuple(sorted(m2 for m2 in reachable[m] if m in reachable.get(m2, ()))) for m in edges if m in reachable[m]}
    return sorted(list(g) for g in groups)


def problems(root: Path) -> list[str]:
    """One line per upward import and per cycle in the package at root."""
    edges = graph(root)
    up = [f"{a} (floor {floors.floor(a)}) imports {b} (floor {floors.floor(b)})"
          for a, deps in edges.items() for b in sorted(deps) if floors.floor(b) > floors.floor(a)]
    return up + [f"import cycle: {' <-> '.join(group)}" for group in cycles(edges)]


def test_every_module_is_on_a_floor_and_imports_downward_only_without_cycles():
    edges = graph(PACKAGE)
    assert len(edges) > 70 and "vit_lightning.model.vit" in edges
    for module in edges:
        floors.floor(module)  # KeyError: a module the floors do not place
    assert problems(PACKAGE) == []


def test_imports_by_name_are_all_routed():
    by_name = {module_name(p, PACKAGE) for p in PACKAGE.rglob("*.py") if any(c in p.read_text() for c in BY_NAME)}
    assert by_name == set(ROUTES)
    assert "vit_lightning.commands.fit.main" in ROUTES["vit_lightning.cli"]  # the routes are read, not empty


def test_ablations_import_the_ablation_and_model_modules_only():
    siblings = {f"ablations.{p.stem}" for p in ABLATIONS.glob("*.py")}
    for path in ABLATIONS.glob("*.py"):
        for name in imported(path, ABLATIONS):
            top = name.split(".")[0]
            ok = (name in siblings or top in sys.stdlib_module_names or top == "__future__"
                  or any(name == m or name.startswith(m + ".") for m in floors.ABLATIONS_IMPORT))
            assert ok, f"{path.name} imports {name}"


def test_an_upward_import_or_a_cycle_breaks_the_rule(tmp_path):
    copy = tmp_path / "vit_lightning"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert problems(copy) == []
    with open(copy / "run" / "rundir.py", "a") as f:  # a function-local import from fit's floor
        f.write("\n\ndef later():\n    from vit_lightning.commands.fit.main import main\n\n    return main\n")
    upward, cycle = problems(copy)  # train imports rundir, so the upward import closes a cycle too
    low, high = floors.floor("vit_lightning.run.rundir"), floors.floor("vit_lightning.commands.fit.main")
    assert low < high and upward == (f"vit_lightning.run.rundir (floor {low}) imports vit_lightning.commands.fit.main "
                                     f"(floor {high})")
    assert cycle.startswith("import cycle: ")
    assert {"vit_lightning.run.rundir", "vit_lightning.commands.fit.main"} <= set(cycle[14:].split(" <-> "))
    shutil.copy(PACKAGE / "run" / "rundir.py", copy / "run" / "rundir.py")
    for module, other in (("hyperband", "loggers"), ("loggers", "hyperband")):  # one floor, but a cycle
        with open(copy / "run" / f"{module}.py", "a") as f:
            f.write(f"\nfrom vit_lightning.run import {other}  # noqa\n")
    assert problems(copy) == ["import cycle: vit_lightning.run.hyperband <-> vit_lightning.run.loggers"]


def test_the_root_keeps_the_entry_point_and_the_floors_name_folders():
    """At most 4 modules at the package's root; each floor names folders (or a root module) and holds <= 15 modules."""
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 4, root_modules
    edges = graph(PACKAGE)
    for level, names in enumerate(floors.FLOORS):
        for name in names:
            path = PACKAGE.joinpath(*name.split("."))
            root_module = path.parent == PACKAGE and path.with_suffix(".py").is_file()
            assert path.is_dir() or root_module or name.endswith("__init__"), f"{name}: a floor names folders"
        held = [m for m in edges if floors.floor(m) == level and not (PACKAGE.parent / m.replace(".", "/")).is_dir()]
        assert len(held) <= 15, f"floor {level} {names} holds {len(held)} modules: split it"
