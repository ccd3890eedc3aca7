"""`method: bayes` on the local backend: Optuna's Gaussian-process sampler proposes each trial from the records.

The records stay the source of truth. A journal next to them (`.bayes-<key>.json` in the sweep's folder) lists
the points proposed so far, in order; each proposal rebuilds the model from scratch under the journal's lock:
every proposed point told with its record's metric (finished: completed, diverged or stopped early), as running
(no finished record yet: the sampler keeps parallel proposals apart from the points still running) or as failed. So a killed
sweep re-run first finishes the proposals left unfinished and then goes on from what the records say; any number
of processes on one run root (--parallel slots, SLURM array tasks) share one search, and the run directory's lock
keeps a point from training twice. The sampler's seed is the sweep's seed plus the number of proposals before it:
the same results give the same next point.

Seed replication: when the sweep's seed (`seed_everything`) takes several values, each proposed point trains at
every one of them (k seeds; `run_cap` counts runs, as on W&B, so a search proposes run_cap // k points) and the
sampler is told the point's mean over its finished seeds, with their spread and count as the trial's attributes.
A point whose seed hyperband stopped is stopped whole: its other seeds are not started. With a confirmation
stage (`confirm`: top m, n seeds), once every proposed point has settled, the m points with the best mean at k
seeds train on to n seeds; `best()` is then the confirmed point with the best mean at n seeds.
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
from vit_lightning.core.names import FINAL, SEED_KEY

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

    def __init__(self, config: dict, cap: int | None, seed: int = 0, gpus: int = 0, retry_failed: bool = False,
                 confirm: tuple[int, int] | None = None):
        if cap is None:
            raise ValueError("method bayes runs until stopped on W&B; give run_cap in the sweep or --count N")
        self.config, self.cap, self.seed, self.gpus, self.retry_failed = config, cap, seed, gpus, retry_failed
        self.params = parameters(config)
        self.replicas = replicas(self.params)
        self.space = {n: d for n, (dist, spec) in self.params.items()
                      if n not in self.replicated() and (d := distribution(dist, spec))}
        if not self.space:
            raise ValueError("method bayes needs a parameter to search: every parameter has a single value")
        if cap < len(self.replicas):
            raise ValueError(f"run_cap/--count {cap} is below the {len(self.replicas)} seeds of one point: "
                             "raise it to a multiple of the seeds")
        self.confirm = check_confirm(confirm, len(self.replicas))
        metric = config["metric"]
        self.metric, self.maximize = metric["name"], metric.get("goal", "minimize") == "maximize"
        consts = {n: spec["value"] for n, (dist, spec) in self.params.items() if dist == "constant"}
        self.folder = run_dir({**consts, TRIAL_KEY: "x"}).parent
        self.journal = self.folder / f".bayes-{self.key()}.json"
        self.claimed: set[str] = set()  # trials this process has handed out (each once)
        self._lock = threading.Lock()
        self.state = State()

    def replicated(self) -> tuple[str, ...]:
        """The seed key when each point trains at several seeds (not searched), else nothing."""
        return (SEED_KEY,) if len(self.replicas) > 1 else ()

    @property
    def points(self) -> int:
        """How many points the search proposes: run_cap counts runs, k per point."""
        return self.cap // len(self.replicas)

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

    def trial(self, raw: dict, seed: Any = None) -> Trial:
        """The run of point `raw` at `seed` (None: the point's first seed, the one its journal entry names)."""
        params = {n: value(dist, spec, raw.get(n)) for n, (dist, spec) in self.params.items()}
        config = self.config
        if self.replicated():
            params[SEED_KEY] = self.replicas[0] if seed is None else seed
            if params[SEED_KEY] not in self.replicas:  # a confirmation run: the test, never stopped early
                config = {k: v for k, v in config.items() if k != "early_terminate"}
        return make(config, params, self.gpus)

    def runs(self, raw: dict, seeds: list | None = None) -> list[Trial]:
        """The point's runs, one per seed (default: its k seeds)."""
        return [self.trial(raw, s) for s in (seeds or self.replicas)]

    def done(self) -> int:
        """Runs settled: finished, or left out because their point was stopped early."""
        total, confirmed = 0, self.confirmed()
        for p in self.proposals():
            runs = self.runs(p["raw"], self.seeds_of(p["raw"], confirmed))
            stopped = self.stopped(runs)
            total += sum(stopped or status_of(t, self.state, True) == "done" for t in runs)
        return total

    def describe(self) -> str:
        """One line: the space, the cap, how far it is."""
        space = ", ".join(f"{n} {dist} {json.dumps(spec)}" for n, (dist, spec) in self.params.items() if n in self.space)
        fixed = len(self.params) - len(self.space)
        return (f"bayes search {self.journal.name}: {self.metric} ({'max' if self.maximize else 'min'}imize) over "
                f"{space} ({fixed} settings fixed); cap {self.cap}; {len(self.proposals())} proposed, {self.done()} "
                "done; the next points depend on the results" + self.replication())

    def replication(self) -> str:
        """The seeds and confirmation stage, as the end of `describe`'s line."""
        if not self.replicated():
            return ""
        text = f"; each point at {len(self.replicas)} seeds ({', '.join(map(str, self.replicas))}), the mean told"
        return text + (f"; the top {self.confirm[0]} confirmed at {self.confirm[1]} seeds" if self.confirm else "")

    # --- proposing -----------------------------------------------------------------------------------
    def next(self) -> Trial | None:
        """The next trial to run here: an unfinished run of a proposed point no one here took, else a new point's
        first run, else a confirmation run; None at the cap (or while the confirmation waits for running points)."""
        with self._lock, _flocked(self.folder / ".bayes.lock"):
            proposals = self.proposals()
            confirmed = self.confirmed()
            for p in proposals[:self.points]:  # a journal longer than the cap (a lower --count) runs no more than it
                if trial := self.pending(self.runs(p["raw"], self.seeds_of(p["raw"], confirmed))):
                    return trial
            if len(proposals) >= self.points:
                return None
            raw = self.propose(proposals)
            if raw is None:
                return None
            trial = self.trial(raw)
            proposals.append({"id": trial.id, "raw": raw})
            write_atomic(self.journal, (json.dumps({"proposals": proposals}, indent=1) + "\n").encode())
            self.claimed.add(trial.id)
            return trial

    def pending(self, runs: list[Trial]) -> Trial | None:
        """The first of a point's runs to start here (claimed), None when none is (all taken, or it was stopped)."""
        if self.stopped(runs):
            return None
        for trial in runs:
            if trial.id not in self.claimed and status_of(trial, self.state, self.retry_failed) == "pending":
                self.claimed.add(trial.id)
                return trial
        return None

    def stopped(self, runs: list[Trial]) -> bool:
        """Some run of the point was stopped early: the point is stopped whole."""
        return any((find_record(t) or {}).get("status") == "stopped_early" for t in runs)

    def seeds_of(self, raw: dict, confirmed: list[dict] | None) -> list:
        """The seeds a point trains at: its k, or n when it is one of the `confirmed`."""
        return self.confirm_seeds() if confirmed and raw in confirmed else self.replicas

    def confirm_seeds(self) -> list:
        """The n seeds of a confirmed point: its k seeds and the next integers after them."""
        start = max(s for s in self.replicas if isinstance(s, int)) + 1
        return list(self.replicas) + list(range(start, start + self.confirm[1] - len(self.replicas)))

    def confirmed(self) -> list[dict] | None:
        """The raw points of the confirmation stage (top m by their mean at k seeds), None before it starts."""
        if not self.confirm or len(proposals := self.proposals()) < self.points:
            return None
        scored = []
        for p in proposals:
            result = self.point_outcome(self.runs(p["raw"]))
            if result == "running":
                return None  # the ranking waits for every point to settle
            if isinstance(result, tuple) and not self.stopped(self.runs(p["raw"])):
                scored.append((result[0], len(scored), p["raw"]))
        scored.sort(key=lambda x: (-x[0] if self.maximize else x[0], x[1]))
        return [raw for _, _, raw in scored[: self.confirm[0]]]

    def best(self) -> tuple[dict, tuple[float, float, int]] | None:
        """The search's choice: the point (its parameter values) with the best mean over its finished seeds, among
        the confirmed ones when there is a confirmation stage; with (mean, std, n). None: nothing finished."""
        confirmed = self.confirmed()
        pool = confirmed if self.confirm else [p["raw"] for p in self.proposals()]
        scored = [(r, raw) for raw in pool or [] if isinstance(r := self.point_outcome(
            self.runs(raw, self.seeds_of(raw, confirmed))), tuple) and not self.stopped(self.runs(raw))]
        if not scored:
            return None
        result, raw = max(scored, key=lambda x: x[0][0] if self.maximize else -x[0][0])
        params = {k: v for k, v in self.trial(raw).params.items() if k in self.space}
        return params, result

    def outcome(self, trial: Trial) -> float | None | str:
        """A proposal's metric when finished, "running" when it may still finish, None when it failed."""
        record = find_record(trial) or {}
        if record.get("status") in FINAL:
            x = (record.get("metrics") or {}).get(self.metric)
            return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
        return None if status_of(trial, self.state) == "failed" else "running"

    def point_outcome(self, runs: list[Trial]) -> tuple[float, float, int] | None | str:
        """(mean, sample std, n) of a point's finished runs once none of them may still finish (a stopped point:
        its finished ones), "running" before that, None when none finished."""
        results = [self.outcome(t) for t in runs]
        if "running" in results and not self.stopped(runs):
            return "running"
        values = [r for r in results if isinstance(r, float)]
        if not values:
            return None
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
        return mean, std, len(values)

    def propose(self, proposals: list[dict]) -> dict | None:
        """A new point (the sampler's raw values) at no proposed point; None when none is left."""
        import optuna
        from optuna.trial import TrialState, create_trial

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # not its notes on optional speed-ups
        sampler = optuna.samplers.GPSampler(seed=self.seed + len(proposals),
                                            n_startup_trials=startup_trials(self.points))
        study = optuna.create_study(direction="maximize" if self.maximize else "minimize", sampler=sampler)
        known: dict[str, tuple | None | str] = {}
        for p in proposals:
            known[self.trial(p["raw"]).id] = result = self.point_outcome(self.runs(p["raw"]))
            finished = isinstance(result, tuple)
            state = TrialState.COMPLETE if finished else TrialState.RUNNING if result == "running" else TrialState.FAIL
            attrs = {"seed_std": result[1], "seeds": result[2]} if finished else {}
            study.add_trial(create_trial(params=p["raw"], distributions=self.space, state=state,
                                         value=result[0] if finished else None, user_attrs=attrs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna's experimental-feature notes
            for _ in range(50):  # a point whose run exists (a quantised or categorical repeat) is told its result
                asked = study.ask(self.space)
                trial = self.trial(asked.params)
                if trial.id not in known:
                    return dict(asked.params)
                result = known[trial.id]
                study.tell(asked, result[0] if isinstance(result, tuple) else None,
                           state=TrialState.COMPLETE if isinstance(result, tuple) else TrialState.FAIL)
        return None


def replicas(params: dict) -> list:
    """The seeds each point trains at: the seed key's values ([None]: one seed, not replicated)."""
    dist, spec = params.get(SEED_KEY, ("constant", {}))
    values = spec.get("values") if dist.startswith("categorical") else None
    return list(values) if values and len(values) > 1 else [None]


def check_confirm(confirm: tuple[int, int] | None, k: int) -> tuple[int, int] | None:
    """The confirmation stage (top m points, n seeds) when it is valid for k seeds per point; ValueError else."""
    if confirm is None:
        return None
    m, n = confirm
    if k < 2:
        raise ValueError("a confirmation stage needs points trained at several seeds: give the sweep's "
                         f"{SEED_KEY} several values or --seeds-per-point K (K >= 2)")
    if m < 1 or n < k:
        raise ValueError(f"confirm: top {m} points at {n} seeds: need at least one point and n >= the {k} seeds "
                         "each point already has")
    return int(m), int(n)


def searches(configs: list[dict], count: int | None, seed: int, gpus: int, retry_failed: bool,
             make_error: Callable[[str], Exception] = ValueError,
             confirm: Callable[[dict], tuple[int, int] | None] = lambda config: None) -> list[Search]:
    """A Search per bayes config, capped by run_cap and --count (the smaller); `confirm`: a config's
    confirmation stage (top m points, n seeds) or None."""
    out = []
    for config in configs:
        if config.get("method") != "bayes":
            continue
        caps = [c for c in (config.get("run_cap"), count) if c is not None]
        try:
            out.append(Search(config, min(caps) if caps else None, seed, gpus, retry_failed, confirm(config)))
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
