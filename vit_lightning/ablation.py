"""An ablation: the paper's question as data (axes, fixed settings, seeds, metric, table, reference values)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from vit_lightning.core.defaults import DEMO
from vit_lightning.core.names import BEST_METRIC, SEED_KEY, SHUFFLE_DROP
from vit_lightning.data.views import VIEWS
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES
from vit_lightning.model.naming import FIRST, NAMING, NAMING_KEY, check_version
from vit_lightning.model.position import where_acts

METRIC = BEST_METRIC
# top-1 lost when each image's patches are shuffled (vit_lightning/analysis/shuffle.py): a column for position ablations
SHUFFLE_COLUMN = {SHUFFLE_DROP: "shuffle drop"}
# which weights it comes from: the final ones, while the tables' accuracy is the best epoch's (the result line says how
# far apart they are); fit keeps only the last checkpoint, so the best epoch's weights cannot be shuffled afterwards
SHUFFLE_NOTE = {"shuffle drop": "top-1 lost when each validation image's patches are permuted (3 fixed permutations): "
                "the final weights' top-1 (the last epoch's val/acc) minus the same weights' top-1 on the shuffled "
                "images (val/shuffle_drop)"}
# How an ablation's table reads (Ablation.layout); results/ has one builder per layout.
LAYOUTS = {
    "grid": "rows x cols (like Table 8); every cell tested against the baseline cell and against the best",
    "lr_sweep": "accuracy vs the learning rate `cols`, one curve per set-up (the other swept keys); "
                "each set-up at its own best learning rate, with a fitted optimum and its confidence interval",
    "compute": "one row per cell with its compute; accuracy against GFLOPs per image",
}


@dataclass(frozen=True)
class Evaluations:
    """The evaluations a local sweep runs on each trial once it has finished, `vit-ablate eval RUN
    --data.img_size=N [options] [a rule's options] --into-record`: every size of `sizes`, with eval's defaults, and on
    every size but the trained one once more per rule whose partial cell the trial's cell matches (how an encoding
    meets a new grid is the encoding's: RoPE's frequency scaling, offsets and table rows kept)."""

    sizes: tuple[int, ...]  # data.img_size of each evaluation
    # (partial cell {key: value or list of values}, eval options): one more evaluation per larger size where it matches
    rules: tuple[tuple[dict[str, Any], tuple[str, ...]], ...] = ()
    options: tuple[str, ...] = ()  # eval options every evaluation takes
    seeds: tuple[int, ...] | None = None  # only the trials of these seeds are evaluated (None: every trial)

    def __post_init__(self):
        if not self.sizes or not all(isinstance(s, int) and s > 0 for s in self.sizes):
            raise ValueError(f"evaluations: sizes are image sides in pixels, got {list(self.sizes)}")
        if self.seeds is not None and not self.seeds:
            raise ValueError("evaluations: seeds is None (every trial) or the seeds whose trials are evaluated")
        for match, options in self.rules:
            if not isinstance(match, dict) or not match or not options or not all(isinstance(o, str) for o in options):
                raise ValueError("evaluations: each rule is (a non-empty partial cell, a non-empty tuple of eval "
                                 f"options), got {match!r}, {options!r}")

    def option_sets(self, params: dict[str, Any], size: int) -> list[tuple[str, ...]]:
        """The eval options of each evaluation of a trial (its flat params) at `size`: the defaults, then its rules."""
        if size == params.get("data.img_size"):
            return [self.options]  # on the trained grid every rule is the default
        def matches(match: dict) -> bool:
            return all(params.get(k) in (v if isinstance(v, (list, tuple)) else [v]) for k, v in match.items())
        return [self.options] + [self.options + opts for match, opts in self.rules if matches(match)]

    def commands(self, run_dir: str, params: dict[str, Any]) -> list[tuple[str, ...]]:
        """Every evaluation of the trial whose run is `run_dir`, as the command line the sweep runs."""
        if self.seeds is not None and params.get(SEED_KEY) not in self.seeds:
            return []
        return [("vit-ablate", "eval", str(run_dir), f"--data.img_size={size}", *opts, "--into-record")
                for size in self.sizes for opts in self.option_sets(params, size)]


@dataclass(frozen=True)
class Profile:
    """One way to run an ablation: dataset, model size and budget, plus the grid of cells and seeds."""

    name: str  # "demo" | "cifar10" | "imagenet"
    fixed: dict[str, Any]  # flat dotted CLI keys -> value, the same for every trial
    grids: tuple[dict[str, list], ...]  # rectangular blocks; each block is one W&B grid sweep
    seeds: tuple[int, ...]  # swept as seed_everything
    description: str = ""
    # a searched profile: W&B sweep keys (method bayes, run_cap, early_terminate) and `parameters` (key -> W&B
    # distribution) for swept keys, which it searches instead of stepping through their grid values; `grid`: the
    # grid profile its table measures it against
    search: dict[str, Any] | None = None
    scope: str = ""  # what this profile can and cannot say about the paper's finding, ending its "Our result" line
    # other papers' numbers for this profile's cells, in place of the ablation's `reference` ({row: value or text})
    reference: dict | None = None
    reference_note: str = ""  # what those numbers are
    naming: int | None = None  # the naming rule version of its trials' names (model/naming.py); None: its ablation's
    settle: bool = False  # its table gives epochs to 0.9, flags cells still rising, and draws the learning curves
    # what each question's oracles reach without the route it names ({panel value: {oracle: accuracy}}): reference
    # rows, measured with data/oracles.py when the profile was designed
    ceilings: dict | None = None
    # the evaluations its runs get without fine-tuning, as (target side, views) pairs (data/views.py: tokens, zoom,
    # both): `vit-ablate eval RUN --declared` runs each, its table shows a column per side and view
    views: tuple[tuple[int, tuple[str, ...]], ...] = ()
    evaluations: Evaluations | None = None  # what the local sweep evaluates on each trial once it has finished
    projected: str = ""  # the profile's projected time, measured and counted when it was designed (--dry-run says it)

    def __post_init__(self):
        if not self.grids or not self.seeds:
            raise ValueError(f"profile {self.name!r}: needs at least one grid block and one seed")
        for side, views in self.views:
            if not (isinstance(side, int) and side > 0 and views and set(views) <= set(VIEWS)):
                raise ValueError(f"profile {self.name!r}: views are (target side, views) pairs, a side in pixels and "
                                 f"views of {', '.join(VIEWS)}; got {(side, views)!r}")
        for block in self.grids:
            if not block or any(not isinstance(v, (list, tuple)) or not v for v in block.values()):
                raise ValueError(f"profile {self.name!r}: each grid block maps keys to non-empty lists")
            if SEED_KEY in block or set(block) & set(self.fixed):
                raise ValueError(f"profile {self.name!r}: a key is either fixed, swept or a seed, not two of these")
            if set(block) != set(self.grids[0]):
                raise ValueError(f"profile {self.name!r}: every grid block must sweep the same keys")
        if self.search is not None and not set(self.search.get("parameters", ())) <= set(self.axes):
            raise ValueError(f"profile {self.name!r}: a search's parameters are keys its grid blocks sweep")
        if self.evaluations is not None and (bad := sorted({k for match, _ in self.evaluations.rules for k in match}
                                                           - set(self.axes) - set(self.fixed))):
            raise ValueError(f"profile {self.name!r}: an evaluation rule matches {bad[0]!r}, which it neither sweeps "
                             f"nor fixes")
        if self.evaluations is not None and not set(self.evaluations.seeds or self.seeds) <= set(self.seeds):
            raise ValueError(f"profile {self.name!r}: its evaluations' seeds must be among its seeds {list(self.seeds)}")
        confirm = (self.search or {}).get("confirm")
        if confirm is not None and not (isinstance(confirm, dict) and set(confirm) == {"top", "seeds"}
                                        and all(isinstance(v, int) and v >= 1 for v in confirm.values())
                                        and confirm["seeds"] >= len(self.seeds) > 1):
            raise ValueError(f"profile {self.name!r}: a search's confirm is {{top: m, seeds: n}}, the top m points "
                             f"trained on to n seeds, n at least the profile's {len(self.seeds)} seeds (2 or more)")

    @property
    def axes(self) -> tuple[str, ...]:
        """The swept keys (besides the seed), in declaration order."""
        return tuple(self.grids[0])

    def cells(self) -> list[dict[str, Any]]:
        """Union of the blocks' cartesian products, in block order, without duplicates."""
        out: list[dict[str, Any]] = []
        for block in self.grids:
            for combo in itertools.product(*block.values()):
                cell = dict(zip(block, combo))
                if cell not in out:
                    out.append(cell)
        return out

    def trials(self) -> list[dict[str, Any]]:
        """Every trial's flat config: fixed settings + cell + seed (seed varies slowest)."""
        return [{**self.fixed, **cell, SEED_KEY: seed} for seed in self.seeds for cell in self.cells()]


@dataclass(frozen=True)
class Ablation:
    """A paper ablation and the profiles it can be run with."""

    name: str
    title: str
    source: str  # the paper's table/figure
    finding: str  # the paper's finding in one sentence
    metric: str
    rows: str  # dotted key for table rows
    cols: str | None  # dotted key for table columns (None: one column)
    reference: dict  # {(row, col) or row: paper value}; cells absent in the paper are N/A
    reference_note: str  # what the reference numbers are
    profiles: dict[str, Profile]
    layout: str = "grid"  # how the table reads: one of LAYOUTS
    baseline: dict[str, Any] | None = None  # the cell the finding says every other cell beats, e.g. {ENC: "none"}
    # A swept key whose values replicate a cell, like seeds: the table averages over them (transfer: the source run)
    replicates: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # further metrics of the record -> column title, mean ± std
    # the grid table's column for a cell (its values) when not its `cols` value, e.g. where an encoding acts; or None
    col_label: Any = None
    # further metrics shown as the cell's mean minus the reference cell's: metric -> (column title, reference cell)
    offsets: dict[str, tuple[str, dict]] = field(default_factory=dict)
    # control profiles: suffix -> column title; profile P's table shows profile P+suffix's accuracy per cell
    controls: dict[str, str] = field(default_factory=dict)
    column_notes: dict[str, str] = field(default_factory=dict)  # column title -> what it measures (the table says it)
    # a swept key whose values ask separate questions (glyph tasks): the grid table tests each value's cells among
    # themselves, with the baseline and the best of that value
    panel: str | None = None
    # > 0: beside each test of a difference, two one-sided tests (TOST) of equivalence within +- this accuracy
    equivalence_margin: float = 0.0
    expected: dict[str, str] = field(default_factory=dict)  # panel value -> the pattern expected, beside the measured
    # panel value ('' without a panel) -> {cell name, or '*' for every cell but the baseline: the verdict expected},
    # beside the measured one in the verdict grid
    expected_verdicts: dict[str, dict[str, str]] = field(default_factory=dict)
    chance: float | None = None  # the accuracy of a guess, where the task fixes it: 'at chance' in the verdict grid
    equivalence_note: str = ""  # why the equivalence margin is what it is (the verdict grid says it)
    # direct comparisons besides those against the baseline and the best: name -> (cell, the cell it is tested
    # against), each a partial cell ({key: value}) that matches one designed cell; one Welch test each, Holm over them
    pairs: dict[str, tuple[dict, dict]] = field(default_factory=dict)
    # lr_sweep only: the figure and the learning rate it shows per set-up (cell name of the swept keys but the lr):
    # curves at chosen lrs, not located optima; the table says whether its optima's ratio excludes a shift that large
    shown_lrs: tuple[str, dict[str, float]] | None = None
    # patch_size only: top-1 of one published model PI-resized to other patch sizes, beside the transfer view
    patch_transfer_reference: dict = field(default_factory=dict)  # evaluated patch size -> top-1
    patch_transfer_source: str = ""  # the model's patch size (the row label)
    patch_transfer_note: str = ""  # what the reference numbers are
    # registry names no profile runs, on purpose: option key -> {name: why} (the coverage test reads it, so a new
    # registry entry is either swept by a new profile or listed here, never added to a committed profile)
    not_swept: dict[str, dict[str, str]] = field(default_factory=dict)
    # the naming rule version its profiles' trials are named by (model/naming.py): a new ablation the newest; one with
    # committed runs the version that named them, so the names (and its sweep YAMLs) stay as they are
    naming: int = NAMING
    doc: str = field(default="", compare=False)  # the ablation file's docstring

    def __post_init__(self):
        if "demo" not in self.profiles:
            raise ValueError(f"ablation {self.name!r}: needs a 'demo' profile")
        if self.layout not in LAYOUTS:
            raise ValueError(f"ablation {self.name!r}: unknown layout {self.layout!r}; "
                             f"choose from {', '.join(LAYOUTS)}")
        for key, reasons in self.not_swept.items():
            if not all(isinstance(why, str) and why.strip() for why in reasons.values()):
                raise ValueError(f"ablation {self.name!r}: not_swept[{key!r}] gives each name a reason")
        fixed = {}
        for key, prof in self.profiles.items():
            if key != prof.name:
                raise ValueError(f"ablation {self.name!r}: profile key {key!r} != its name {prof.name!r}")
            if self.rows not in prof.axes or (self.cols and self.cols not in prof.axes + tuple(prof.fixed)):
                raise ValueError(f"ablation {self.name!r}: profile {key!r} does not sweep rows/cols {self.rows}/{self.cols}")
            if self.replicates is not None and self.replicates in (self.rows, self.cols):
                raise ValueError(f"ablation {self.name!r}: replicates={self.replicates!r} must be a key other than "
                                 "rows and cols")
            self._check_table(prof)
            # every record lands in runs/<ablation>/<profile>/...; a later naming rule reaches fit as run.naming
            version = check_version(self.naming if prof.naming is None else prof.naming)
            run_keys = {"run.ablation": self.name, "run.profile": prof.name,
                        **({NAMING_KEY: version} if version != FIRST else {})}
            fixed[key] = dataclasses.replace(prof, fixed={**prof.fixed, **run_keys})
        object.__setattr__(self, "profiles", fixed)

    def _check_table(self, prof: Profile) -> None:
        """The layout's needs and the baseline hold for this profile; ValueError naming the problem otherwise."""
        where = f"ablation {self.name!r}, profile {prof.name!r}"
        if self.layout == "lr_sweep":
            if not self.cols or self.cols not in prof.axes or self.baseline:
                raise ValueError(f"{where}: the lr_sweep layout needs cols = a swept learning-rate key, no baseline")
            for block in prof.grids:
                lrs = block[self.cols]
                if len(lrs) < 3 or not all(isinstance(v, (int, float)) and v > 0 for v in lrs):
                    raise ValueError(f"{where}: {self.cols} needs at least 3 positive numbers per grid block, "
                                     f"got {list(lrs)}")
        if self.panel is not None and (self.layout != "grid" or self.panel not in prof.axes):
            raise ValueError(f"{where}: panel {self.panel!r} needs the grid layout and a swept key "
                             f"({', '.join(prof.axes)})")
        if not 0.0 <= self.equivalence_margin < 1.0:
            raise ValueError(f"{where}: equivalence_margin is an accuracy in [0, 1), got {self.equivalence_margin}")
        if self.baseline is not None:
            if not set(self.baseline) <= set(prof.axes):
                raise ValueError(f"{where}: baseline keys {sorted(self.baseline)} are not all swept "
                                 f"({', '.join(prof.axes)})")
            cells = {tuple(sorted((k, repr(v)) for k, v in c.items() if k != self.replicates)): c for c in prof.cells()}
            matches = [c for c in cells.values() if all(c[k] == v for k, v in self.baseline.items())]
            panel = (lambda c: repr(c[self.panel])) if self.panel else (lambda c: None)
            if len(matches) != len({panel(c) for c in cells.values()}) or len({panel(c) for c in matches}) < len(matches):
                each = f" in each {self.panel}" if self.panel else ""
                raise ValueError(f"{where}: baseline {self.baseline} matches {len(matches)} cells, needs exactly "
                                 f"1{each}")

    def table_profile(self, name: str) -> Profile:
        """The named profile as its table reads it: the replicates key left out of the cells."""
        prof = self.profile(name)
        if self.replicates is None:
            return prof
        grids = tuple({k: v for k, v in block.items() if k != self.replicates} for block in prof.grids)
        return dataclasses.replace(prof, grids=grids)

    def profile(self, name: str) -> Profile:
        """The named profile; ValueError naming the choices otherwise."""
        if name not in self.profiles:
            raise ValueError(f"ablation {self.name!r} has no profile {name!r}; choose from {', '.join(self.profiles)}")
        return self.profiles[name]

    def cells(self, profile: str = "demo") -> list[dict[str, Any]]:
        """The table cells the profile runs (axis values only)."""
        return self.profile(profile).cells()

    def trials(self, profile: str = "demo") -> list[dict[str, Any]]:
        """Every trial's flat config, seed included."""
        return self.profile(profile).trials()


# Settings every ablation shares per profile; an ablation file overrides what it studies.
# GPU profiles leave trainer.devices=auto so each trial uses all GPUs its agent was given
# (CUDA_VISIBLE_DEVICES), i.e. `--gpus-per-agent K` decides the DDP width.
GPU_TRAINING = {  # AdamW recipe shared by the GPU profiles: 100 epochs, 5 warm-up, bf16 on every visible GPU
    "model.lr": 0.001,
    "model.weight_decay": 0.05,
    "model.warmup_epochs": 5,
    "model.label_smoothing": 0.1,
    "trainer.max_epochs": 100,
    "trainer.accelerator": "gpu",
    "trainer.devices": "auto",
    "trainer.precision": "bf16-mixed",
}
BASE: dict[str, dict[str, Any]] = {
    "demo": {  # offline CPU demo: fit's own defaults (a micro ViT/7 on the embedded mnist5k), ~20 s a trial
        **DEMO,
        "model.patch_size": FAMILIES[DEFAULT_ARCH].demo_patch,
        "data.random_crop": False,  # augmentation only slows a 9-epoch run down
        "trainer.accelerator": "cpu",
        "trainer.devices": 1,
    },
    "cifar10": {  # one GPU node: ViT-S/4 at 32 px, 100 epochs, RandAugment
        "data.name": "cifar10",
        "data.root": "data",
        "data.download": True,
        "data.batch_size": 256,
        "data.num_workers": 8,
        "data.randaugment": True,
        "model.variant": "S",
        "model.patch_size": 4,
        **GPU_TRAINING,
    },
    "imagenet": {  # ViT-B/16 from scratch at 224 px, DeiT-style augmentation, 100 epochs
        "data.name": "imagefolder",
        "data.root": "data/imagenet",
        "data.img_size": 224,
        "data.batch_size": 128,
        "data.num_workers": 10,
        "data.randaugment": True,
        "data.mixup_alpha": 0.8,
        "data.cutmix_alpha": 1.0,
        "model.variant": "B",
        "model.patch_size": 16,
        **GPU_TRAINING,
    },
}
SEEDS = {"demo": (0, 1, 2), "cifar10": (0, 1, 2), "imagenet": (0, 1, 2)}


def profile(name: str, grids, fixed: dict | None = None, seeds=None, description: str = "", scope: str = "") -> Profile:
    """A Profile on top of BASE[name]: `fixed` overrides the base, keys swept by `grids` leave it.

    The description gets the budget appended from the settings themselves, so it cannot go stale.
    """
    grids = (grids,) if isinstance(grids, dict) else tuple(grids)
    base = {k: v for k, v in BASE[name].items() if k not in grids[0]}
    fixed = {**base, **(fixed or {})}
    seeds = tuple(seeds or SEEDS[name])
    budget = f"{fixed['trainer.max_epochs']} epochs, {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    return Profile(name, fixed, grids, seeds, ", ".join(filter(None, [description, budget])), scope=scope)


@dataclass(frozen=True, repr=False)
class RunsOf:
    """A swept value standing for every run (one per seed, or those of `seeds`) of another ablation's profile
    in this grid block's cell: the sweep names them by run directory (sweep.yamls), as `model.init_from` takes."""

    ablation: Ablation
    profile: str
    seeds: tuple[int, ...] | None = None  # None: every seed of the source profile

    def __repr__(self) -> str:
        return f"RunsOf({self.ablation.name!r}, {self.profile!r}, seeds={self.seeds})"


def runs_of(source: Ablation, name: str, key: str, seeds: tuple[int, ...] | None = None) -> tuple[dict, ...]:
    """One grid block per cell of source's profile `name`: that cell, and `key` swept over its runs (RunsOf)."""
    return tuple({**{k: [v] for k, v in cell.items()}, key: [RunsOf(source, name, seeds)]}
                 for cell in source.profile(name).cells())


def runs_values(ablations: list[Ablation], key: str) -> set:
    """Every name (str value) of `key` some profile of `ablations` runs, swept or fixed."""
    profiles = [prof for ab in ablations for prof in ab.profiles.values()]
    values = [cell.get(key) for prof in profiles for cell in prof.cells()] + [prof.fixed.get(key) for prof in profiles]
    return {value for value in values if isinstance(value, str)}


def uncovered(key: str, names, ablations: list[Ablation]) -> list[str]:
    """The registry `names` of option `key` that no profile of `ablations` runs and no ablation lists in not_swept."""
    listed = {name for ab in ablations for name in ab.not_swept.get(key, {})}
    runs = runs_values(ablations, key)
    return [name for name in names if name not in runs and name not in listed]


def where_encoding_acts(encoding: str, injection: str) -> str | None:
    """A grid column for an encoding that does not act at the stem (where it acts instead), else None."""
    return where_acts(encoding, injection)


# A fixed value `select:<profile>`: the sweep sets it per grid block to the value that profile's runs of the same
# cell scored best with on their validation data (sweep/select.py), and refuses to start until those runs finished.
SELECT = "select:"


def selected_by(profile_name: str) -> str:
    """The fixed value that stands for the value of its key selected by this ablation's profile `profile_name`."""
    return SELECT + profile_name


def selector(value: Any) -> str | None:
    """The selecting profile's name when value is a `select:` value, else None."""
    return value[len(SELECT):] if isinstance(value, str) and value.startswith(SELECT) else None


def beyond(tried: list[float], upward: bool) -> float:
    """The next value past the largest (upward) or smallest of `tried` (two or more, positive), one step of the ratio
    of the two values at that edge, as a doubling or halving grid steps on (0.2, 0.4 -> 0.8; 0.003, 0.01 -> 0.0009):
    where a selection at the edge of its values goes next."""
    ordered = sorted(tried)
    inner, edge = (ordered[-2], ordered[-1]) if upward else (ordered[1], ordered[0])
    return float(f"{edge * edge / inner:.3g}")  # 3 digits: 0.003 * 0.3 is 0.0009, not 0.0009000000000000001


PACKAGE = "vit_lightning.ablations"  # installed from the top-level ablations/ folder (pyproject: package-dir)


def source_checkout() -> Path | None:
    """The source tree this package runs from (editable install or PYTHONPATH), if it is one."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "ablations" / "__init__.py").is_file() else None


def packaged() -> ModuleType:
    """The ablations package: this checkout's ablations/ when running from source, else the installed one."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    root = source_checkout()
    if root is None:
        return importlib.import_module(PACKAGE)
    # Under PYTHONPATH the package's own folder has no ablations/; an editable install of another
    # checkout would map the name there. Both ways this checkout's folder is the right one.
    folder = root / "ablations"
    spec = importlib.util.spec_from_file_location(PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def _names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def available(directory: Path | None = None) -> list[str]:
    """Names of the packaged ablations, plus those in `directory` (the user's --ablations-dir)."""
    names = sorted(m.name for m in pkgutil.iter_modules(packaged().__path__) if not m.name.startswith("_"))
    if directory is None:
        return names
    if not Path(directory).is_dir():
        raise ValueError(f"--ablations-dir {directory}: not a directory")
    if clash := sorted(set(names) & set(_names(Path(directory)))):
        raise ValueError(f"{Path(directory) / clash[0]}.py: a packaged ablation has this name; rename the file and its name=")
    return sorted(names + _names(Path(directory)))


def load(name: str, directory: Path | None = None) -> Ablation:
    """The ABLATION of a packaged ablation, or of `directory`/<name>.py."""
    names = available(directory)
    if name not in names:
        raise ValueError(f"unknown ablation {name!r}; choose from {', '.join(names)}")
    if directory is not None and (Path(directory) / f"{name}.py").is_file():
        path = Path(directory) / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"vit_lightning_user_ablations.{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look a module up by name
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(f"{packaged().__name__}.{name}")
    ablation = getattr(module, "ABLATION", None)
    if not isinstance(ablation, Ablation) or ablation.name != name:
        raise ValueError(f"{module.__file__}: must define ABLATION = Ablation(name={name!r}, ...)")
    return dataclasses.replace(ablation, doc=(module.__doc__ or "").strip())
