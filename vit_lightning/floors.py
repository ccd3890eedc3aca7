"""The layer rule: every module sits on a floor and imports only from floors below its own (tests/test_layers.py).

Floors from the bottom. A name is a module or a subpackage of vit_lightning, dotted below the package
(`run.rundir`); a subpackage named whole holds all its modules, and the longest name that matches places a module.
`__init__` is the package's own __init__.py, which re-exports the model; a subpackage's __init__ holds only its
docstring and sits on the ground floor. Modules that share a floor must not import each other in a cycle.
"""

FLOORS = (
    ("bookkeeping", "identity", "defaults", "compat", "plotstyle", "floors", "evalkey",
     "data.__init__", "run.__init__", "analysis.__init__"),  # plain vocabulary; the folders' docstrings
    ("model", "data", "ablation", "__init__", "run.slurm_tasks"),  # the parts a run is built from
    ("run.rundir", "run.rng", "run.machine"),  # a run dir's lock, record and checkpoints; its random generators; what
    # this machine can run
    ("run.transfer",),  # resolve an init_from source, adopt its architecture, reshape its weights
    ("run.module", "run.options"),  # the LightningModule; the values each fit option accepts
    ("run.callbacks",),  # what fit attaches: stops, reseeding, progress lines
    ("run.record",),  # the run record fit keeps
    ("run.hyperband", "run.loggers"),  # early termination from the records; the CSV and W&B loggers
    ("analysis.trained", "analysis.attention"),  # a trained run loaded back; read-outs of its attention maps
    ("analysis.fewshot",),  # few-shot probes of its frozen features
    ("analysis.shuffle",),  # its accuracy with the patches shuffled
    ("analysis.evaluate",),  # `vit-ablate eval`
    ("train",),  # `vit-ablate fit`
    ("sweep", "results", "viz", "bench", "docs"),  # the commands around fit; the reference pages they document
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
    raise KeyError(f"{module} is on no floor: add it to vit_lightning/floors.py")
