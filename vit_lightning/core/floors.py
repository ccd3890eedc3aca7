"""The layer rule: every module sits on a floor and imports only from floors below its own (tests/test_layers.py).

Floors from the bottom. A name is a module or a subpackage of vit_lightning, dotted below the package
(`run.rundir`); a subpackage named whole holds all its modules, and the longest name that matches places a module.
`__init__` is the package's own __init__.py, which re-exports the model; a subpackage's __init__ holds only its
docstring and sits on the ground floor. Modules that share a floor must not import each other in a cycle.
"""

FLOORS = (
    ("core", "compat", "commands.__init__"),  # the shared vocabulary; third-party seams; the commands' docstring
    ("model.from_timm",),  # timm's models into ours: each family's importer (its entry names it)
    ("model",),  # the backbone families and their parts
    ("data", "ablation", "__init__"),  # the data a run reads; an ablation's design; the package's exports
    ("run",),  # one run's machinery: its directory, start, module, callbacks, record and loggers
    ("analysis", "records"),  # a trained run read back (few-shot, shuffle, evaluate); the records read back
    ("commands.fit", "commands.reproduce"),  # `vit-ablate fit`; `vit-ablate reproduce`: published weights evaluated
    ("commands.docs", "commands.viz"),  # the reference pages; a run's figures
    ("commands.sweep",),  # `vit-ablate sweep`: one fit per trial
    ("commands.results",),  # `vit-ablate table`: records -> tables and plots (figures from viz)
    ("commands.bench",),  # `vit-ablate bench`: times fits and sweeps
    ("cli",),  # `vit-ablate`
)
# ablations/ are data: they import these (and each other) only
ABLATIONS_IMPORT = ("vit_lightning.ablation", "vit_lightning.model")


def floor(module: str) -> int:
    """The floor of a dotted module name under vit_lightning; KeyError for a module no floor names."""
    parts = module.split(".")[1:] or ["__init__"]
    if len(parts) == 1 and any(n.startswith(parts[0] + ".") for names in FLOORS for n in names):
        parts.append("__init__")  # a subpackage whose modules sit on several floors: its __init__
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        for level, names in enumerate(FLOORS):
            if name in names:
                return level
    raise KeyError(f"{module} is on no floor: add it to vit_lightning/core/floors.py")
