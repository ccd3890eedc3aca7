"""The layer rule: every module sits on a floor and imports only from its own floor or below (tests/test_layers.py).

Floors from the bottom. A name is a module or a subpackage of vit_lightning (a subpackage holds all its modules);
`__init__` is the package's own __init__.py, which re-exports the model. Imports on one floor must not form a cycle.
"""

FLOORS = (
    ("bookkeeping", "identity", "defaults", "compat", "plotstyle", "slurm_tasks", "floors"),  # plain vocabulary
    ("model", "augment", "data", "rundir", "ablation", "__init__"),  # parts; a run dir's lock, record, checkpoint
    ("transfer",),  # resolve an init_from source, adopt its architecture, reshape its weights
    ("module",),  # the LightningModule
    ("callbacks", "record", "loggers", "hyperband", "trained", "fewshot", "shuffle", "evaluate"),  # what fit attaches; a trained run
    ("train",),  # `vit-ablate fit`
    ("sweep", "results", "viz", "bench"),  # the commands around fit
    ("cli",),  # `vit-ablate`
)
# ablations/ are data: they import these (and each other) only
ABLATIONS_IMPORT = ("vit_lightning.ablation", "vit_lightning.model")


def floor(module: str) -> int:
    """The floor of a dotted module name under vit_lightning; KeyError for a module no floor names."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    for level, names in enumerate(FLOORS):
        if name in names:
            return level
    raise KeyError(f"{module} is on no floor: add it to vit_lightning/floors.py")
