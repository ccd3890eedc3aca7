"""`method: bayes` on the local backend: Optuna's Gaussian-process sampler proposes each trial from the records.

The records stay the source of truth. A journal next to them (`.bayes-<key>.json` in the sweep's folder) lists
the points proposed so far, in order; each proposal rebuilds the model from scratch under the journal's lock:
every proposed point told with its record's metric (finished: completed, diverged or stopped early), as running
(no finished record yet: the sampler keeps parallel proposals apart from the points still running) or as failed. So a killed
sweep re-run first finishes the proposals left unfinished and then goes on from what the records say; any number
of processes on one run root (--parallel slots, SLURM array tasks) share one search, and the run directory's lock
keeps a point from training twice. The sampler's seed is the sweep's seed plus the number of proposals before it:
the same results give the same next point.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist
from typing import Any

from vit_lightning.commands.sweep.expand import _quantize, parameters
from vit_lightning.commands.sweep.local import State, _flocked, status_of
from vit_lightning.commands.sweep.repair import journal_shape
from vit_lightning.commands.sweep.trials import Trial, find_record, make
from vit_lightning.core.files import write_atomic
from vit_lightning.core.identity import TRIAL_KEY, normalize, run_dir
from vit_lightning.core.names import FINAL

EDGE = 1e-6  # a normal's or beta's quantile is drawn in [EDGE, 1 - EDGE]: the tails are finite


def startup_trials(cap: int) -> int:
    """Random proposals before the model takes over: a quarter of the budget, 3 to 10 (Optuna's default)."""
    return min(10, max(3, cap // 4))


def distribution(dist: str, spec: dict):
    """The Optuna distribution a W&B parameter is searched in (None: a constant)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if dist == "constant" or (dist.startswith("categorical") and len(spec["values"]) == 1):
        return None
    if dist.startswith("categorical"):  # by index: values may be lists or mappings
        return CategoricalDistribution(list(range(len(spec["values"]))))
    if dist == "int_uniform":
        return IntDistribution(spec["min"], spec["max"])
    if "min" in spec:
        lo, hi = spec["min"], spec["max"]
        if dist in ("log_uniform", "q_log_uniform"):  # bounds given in log space
            lo, hi = math.exp(lo), math.exp(hi)
        return FloatDistribution(lo, hi, log="log" in dist)
    return FloatDistribution(EDGE, 1 - EDGE)  # normal, log_normal, beta: a quantile of the distribution


def value(dist: str, spec: dict, raw: Any) -> Any:
    """The parameter's value at the sampler's point `raw` (W&B's value: quantised, exponentiated, ...)."""
    if dist == "constant":
        return spec["value"]
    if dist.startswith("categorical"):
        return spec["values"][raw or 0]
    if dist == "int_uniform" or "min" in spec:
        x = raw
    elif "mu" in spec:
        x = NormalDist(spec["mu"], spec["sigma"]).inv_cdf(raw)
        x = math.exp(x) if "log" in dist else x
    else:
        from scipy.stats import beta

        x = float(beta.ppf(raw, spec["a"], spec["b"]))
    return _quantize(x, spec["q"]) if dist.startswith("q_") else x


class Search:
    """One bayes sweep config: `next()` hands out its trials (unfinished proposals first) until the cap."""

    def __init__(self, config: dict, cap: int | None, seed: int = 0, gpus: int = 0, retry_failed: bool = False):
        if cap is None:
            raise ValueError("method bayes runs until stopped on W&B; give run_cap in the sweep or --count N")
        self.config, self.cap, self.seed, self.gpus, self.retry_failed = config, cap, seed, gpus, retry_failed
        self.params = parameters(config)
        self.space = {n: d for n, (dist, spec) in self.params.items() if (d := distribution(dist, spec))}
        if not self.space:
            raise ValueError("method bayes needs a parameter to search: every parameter has a single value")
        metric = config["metric"]
        self.metric, self.maximize = metric["name"], metric.get("goal", "minimize") == "maximize"
        consts = {n: spec["value"] for n, (dist, spec) in self.params.items() if dist == "constant"}
        self.folder = run_dir({**consts, TRIAL_KEY: "x"}).parent
        self.journal = self.folder / f".bayes-{self.key()}.json"
        self.claimed: set[str] = set()  # trials this process has handed out (each once)
        self._lock = threading.Lock()
        self.state = State()

    def key(self) -> str:
        """The search's identity: its name and a hash of what it searches (not its cap or description)."""
        body = {k: v for k, v in self.config.items() if k not in ("run_cap", "description")}
        digest = hashlib.sha1(json.dumps(normalize(body), sort_keys=True, default=str).encode()).hexdigest()[:8]
        return f"{self.config.get('name') or 'sweep'}-{digest}"

    # --- the journal ---------------------------------------------------------------------------------
    def proposals(self) -> list[dict]:
        """[{id, raw}] in the order proposed; ValueError (one line) for a damaged journal."""
        try:
            data = json.loads(self.journal.read_text())
        except FileNotFoundError:
            return []
        except ValueError as error:  # `vit-ablate sweep` checks the journal before it starts (repair.py)
            raise ValueError(f"{self.journal}: damaged bayes journal ({' '.join(str(error).split())}); "
                             "`vit-ablate sweep ... --repair` rebuilds it from the records") from None
        if problem := journal_shape(data):
            raise ValueError(f"{self.journal}: damaged bayes journal ({problem}); `vit-ablate sweep ... --repair` "
                             "rebuilds it from the records")
        return list(data["proposals"])

    def trial(self, raw: dict) -> Trial:
        params = {n: value(dist, spec, raw.get(n)) for n, (dist, spec) in self.params.items()}
        return make(self.config, params, self.gpus)

    def done(self) -> int:
        """Proposals with a finished record."""
        return sum(status_of(self.trial(p["raw"]), self.state, True) == "done" for p in self.proposals())

    def describe(self) -> str:
        """One line: the space, the cap, how far it is."""
        space = ", ".join(f"{n} {dist} {json.dumps(spec)}" for n, (dist, spec) in self.params.items() if n in self.space)
        fixed = len(self.params) - len(self.space)
        return (f"bayes search {self.journal.name}: {self.metric} ({'max' if self.maximize else 'min'}imize) over "
                f"{space} ({fixed} settings fixed); cap {self.cap}; {len(self.proposals())} proposed, {self.done()} "
                "done; the next points depend on the results")

    # --- proposing -----------------------------------------------------------------------------------
    def next(self) -> Trial | None:
        """The next trial to run here: an unfinished proposal no one here took, else a new one; None at the cap."""
        with self._lock, _flocked(self.folder / ".bayes.lock"):
            proposals = self.proposals()
            trials = [self.trial(p["raw"]) for p in proposals]
            for trial in trials:
                if trial.id not in self.claimed and status_of(trial, self.state, self.retry_failed) == "pending":
                    self.claimed.add(trial.id)
                    return trial
            if len(proposals) >= self.cap:
                return None
            raw = self.propose(proposals, trials)
            if raw is None:
                return None
            trial = self.trial(raw)
            proposals.append({"id": trial.id, "raw": raw})
            write_atomic(self.journal, (json.dumps({"proposals": proposals}, indent=1) + "\n").encode())
            self.claimed.add(trial.id)
            return trial

    def outcome(self, trial: Trial) -> float | None | str:
        """A proposal's metric when finished, "running" when it may still finish, None when it failed."""
        record = find_record(trial) or {}
        if record.get("status") in FINAL:
            x = (record.get("metrics") or {}).get(self.metric)
            return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
        return None if status_of(trial, self.state) == "failed" else "running"

    def propose(self, proposals: list[dict], trials: list[Trial]) -> dict | None:
        """A new point (the sampler's raw values) at no proposed trial's run; None when none is left."""
        import optuna
        from optuna.trial import TrialState, create_trial

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # not its notes on optional speed-ups
        sampler = optuna.samplers.GPSampler(seed=self.seed + len(proposals), n_startup_trials=startup_trials(self.cap))
        study = optuna.create_study(direction="maximize" if self.maximize else "minimize", sampler=sampler)
        known: dict[str, float | None | str] = {}
        for p, trial in zip(proposals, trials):
            known[trial.id] = result = self.outcome(trial)
            finished = isinstance(result, float)
            state = TrialState.COMPLETE if finished else TrialState.RUNNING if result == "running" else TrialState.FAIL
            study.add_trial(create_trial(params=p["raw"], distributions=self.space, state=state,
                                         value=result if finished else None))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna's experimental-feature notes
            for _ in range(50):  # a point whose run exists (a quantised or categorical repeat) is told its result
                asked = study.ask(self.space)
                trial = self.trial(asked.params)
                if trial.id not in known:
                    return dict(asked.params)
                result = known[trial.id]
                study.tell(asked, result if isinstance(result, float) else None,
                           state=TrialState.COMPLETE if isinstance(result, float) else TrialState.FAIL)
        return None


def searches(configs: list[dict], count: int | None, seed: int, gpus: int, retry_failed: bool,
             make_error: Callable[[str], Exception] = ValueError) -> list[Search]:
    """A Search per bayes config, capped by run_cap and --count (the smaller)."""
    out = []
    for config in configs:
        if config.get("method") != "bayes":
            continue
        caps = [c for c in (config.get("run_cap"), count) if c is not None]
        try:
            out.append(Search(config, min(caps) if caps else None, seed, gpus, retry_failed))
        except ValueError as err:
            raise make_error(f"{config.get('name') or 'sweep'}: {err}") from None
    return out


def ids_of(folder: Path) -> list[str]:
    """Every proposal's trial id in the bayes journals of a sweep folder (for tests and tables)."""
    out = []
    for path in sorted(folder.glob(".bayes-*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue  # a damaged journal: the records still say which runs exist
        out += [] if journal_shape(data) else [p["id"] for p in data["proposals"]]
    return out
