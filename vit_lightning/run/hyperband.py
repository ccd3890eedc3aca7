"""W&B's hyperband early termination, decided inside a trial at each epoch's end from the records on disk.

The rule (W&B's sweep engine): brackets at epochs `min_iter * eta**k`, or `max_iter / eta**k` for k = 1..s
(kept while >= 1, truncated to integers). At a bracket b, the threshold is the value at rank floor(n / eta)
(0-based, best first) among the b-th values of every trial of the sweep that has reached b (itself included).
A running trial is judged at the last bracket it has reached: with `strict` (W&B's default) by its b-th value,
otherwise by its best value so far; it stops when that is worse than the threshold (a tie carries on). An
iteration is an epoch whose value is a number: epochs without one (no validation, a non-finite value) are
skipped, as W&B skips history rows without the metric.

A sweep whose points train at several seeds (a replicated bayes search: `replicate` names the seed key) judges
points, not runs: a point's value at an epoch is the mean over its seeds that reached it, every point's mean
curve is a history, and a run stops when its point's verdict says so or when a run of its point was stopped
(the point's seeds stop together; the search starts none of its other seeds).

A trial gets its sweep's rule as a run option on its command line (OPTION, `--run.early_terminate=JSON`, put there
by the sweep for both backends), so the command a trial records reproduces it. The trial reads the other trials'
records from its sweep's folder (those whose fixed settings are its own), so parallel slots and SLURM array
tasks on one run root judge against the same histories; under a W&B agent the server applies the same rule too.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
from typing_extensions import override

from vit_lightning.core.checks import number_in, span
from vit_lightning.core.identity import normalize
from vit_lightning.core.names import BEST_METRIC
from vit_lightning.run.record import HISTORY_KEYS
from vit_lightning.run.rundir import load_record

# fit's option: JSON {rule: early_terminate, metric: {name, goal}, fixed: {key: value}[, replicate: the seed key]}
OPTION = "run.early_terminate"
FIELDS = ("type", "min_iter", "max_iter", "s", "eta", "strict")
METRICS = (*HISTORY_KEYS, BEST_METRIC)  # the metrics a record has per epoch (val/acc_best: the best val/acc so far)
MAX_ETA, MAX_S, MAX_ITER = 1e3, 100, 10**6  # finite settings W&B's rule makes sense with (s: brackets, iter: epochs)


@dataclass(frozen=True)
class Rule:
    """Brackets (epochs, ascending), eta, strict, the metric and whether larger is better."""

    bands: tuple[int, ...]
    eta: float
    strict: bool
    metric: str
    maximize: bool


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse(early: object, metric: dict) -> Rule:
    """The rule of a sweep's `early_terminate` and `metric`; ValueError naming the bad field."""
    if not isinstance(early, dict):
        raise ValueError(f"early_terminate must be a mapping such as {{type: hyperband, min_iter: 3}}, got {early!r}")
    if early.get("type") != "hyperband":
        raise ValueError(f"early_terminate.type {early.get('type')!r} is not supported; choose hyperband")
    if extra := sorted(set(early) - set(FIELDS)):
        raise ValueError(f"early_terminate.{extra[0]} is not a hyperband field; fields: {', '.join(FIELDS)}")
    eta, strict = early.get("eta", 3), early.get("strict", True)
    if not number_in(eta, 1, MAX_ETA, low_open=True):
        raise ValueError(f"early_terminate.eta must be a number above 1, finite, in {span(1, MAX_ETA, True)}, "
                         f"got {eta!r}")
    if not isinstance(strict, bool):
        raise ValueError(f"early_terminate.strict must be true or false, got {strict!r}")
    if "min_iter" in early:
        low = early["min_iter"]
        if not number_in(low, 1, MAX_ITER, integer=True):
            raise ValueError(f"early_terminate.min_iter must be a positive integer, at most {MAX_ITER}, got {low!r}")
        bands = [int(low * eta**k) for k in range(100) if low * eta**k < 1e9]
    elif "max_iter" in early:
        high, s = early["max_iter"], early.get("s")
        if not number_in(high, 1, MAX_ITER, integer=True):
            raise ValueError(f"early_terminate.max_iter must be a positive integer, at most {MAX_ITER}, got {high!r}")
        if not number_in(s, 1, MAX_S):
            raise ValueError(f"early_terminate.s (the number of brackets below max_iter) must be given with "
                             f"max_iter as a finite number in {span(1, MAX_S)}, got {s!r}")
        bands = [int(high / eta**k) for k in range(1, int(math.ceil(s)) + 1) if high / eta**k >= 1]
        if not bands:
            raise ValueError(f"early_terminate: max_iter {high} / eta {eta} is below 1: no bracket; "
                             "raise max_iter or lower eta")
    else:
        raise ValueError("early_terminate needs min_iter, or max_iter and s")
    name = check_metric(metric, METRICS, "early_terminate", " each epoch")
    return Rule(tuple(sorted(set(bands))), float(eta), strict, name, metric.get("goal", "minimize") == "maximize")


def check_metric(metric: dict, logged, who: str, when: str = "") -> str:
    """The metric's name when a trial logs it (`logged`), else ValueError naming it and the metrics logged."""
    name = metric.get("name")
    if name not in logged:
        raise ValueError(f"{who} needs a metric a trial records{when}; metric.name {name!r} is not one: choose from "
                         f"{', '.join(logged)}")
    return name


def setting(rule: dict, metric: dict, fixed: dict, replicate: str | None = None) -> str:
    """The value of fit's `run.early_terminate`: a sweep's rule, its metric, its fixed settings (and the seed key of
    a search whose points train at several seeds) as one JSON text."""
    value = {"rule": rule, "metric": metric, "fixed": fixed, **({"replicate": replicate} if replicate else {})}
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def option_error(text: str | None) -> str | None:
    """Why a `run.early_terminate` value is not a sweep's rule (one line), or None (unset, or good)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if (not isinstance(value, dict) or set(value) - {"rule", "metric", "fixed", "replicate"}
            or not isinstance(value.get("fixed", {}), dict) or not isinstance(value.get("replicate", ""), str)):
        return (f"{OPTION} must be JSON {{\"rule\": {{\"type\": \"hyperband\", ...}}, \"metric\": {{\"name\", \"goal\"}}, "
                f"\"fixed\": {{...}}}} (a sweep writes it), got {text!r}")
    try:
        parse(value.get("rule"), value.get("metric") if isinstance(value.get("metric"), dict) else {})
    except ValueError as error:
        return f"{OPTION}: {error}"
    return None


def series(history: list[dict], metric: str) -> list[float]:
    """The metric at each epoch that has a number for it (val/acc_best: the best val/acc up to that epoch)."""
    key = "val/acc" if metric == BEST_METRIC else metric
    values = [h.get(key) for h in history]
    values = [float(v) for v in values if _number(v) and math.isfinite(v)]
    if metric == BEST_METRIC:
        values = [max(values[: k + 1]) for k in range(len(values))]
    return values


def thresholds(rule: Rule, histories: list[list[float]]) -> list[float]:
    """Per bracket, the value a trial must not fall below (above, when minimising): rank floor(n / eta)."""
    out = []
    for band in rule.bands:
        reached = sorted((h[band - 1] for h in histories if len(h) >= band), reverse=rule.maximize)
        out.append(reached[int(1.0 / rule.eta * len(reached))] if reached else (-math.inf if rule.maximize else math.inf))
    return out


def verdict(rule: Rule, own: list[float], histories: list[list[float]]) -> str | None:
    """Why this trial stops now (one line), or None. `histories`: every trial of the sweep, this one included."""
    reached = [(b, t) for b, t in zip(rule.bands, thresholds(rule, histories)) if b <= len(own)]
    if not reached:
        return None
    band, threshold = reached[-1]
    value = own[band - 1] if rule.strict else (max(own) if rule.maximize else min(own))
    worse = value < threshold if rule.maximize else value > threshold
    if not worse:
        return None
    return (f"hyperband: {rule.metric} {value:.4g} at bracket {band} ({'strict' if rule.strict else 'best so far'}) "
            f"is below the top 1/{rule.eta:g} of the sweep's trials there (threshold {threshold:.4g})")


def sweep_records(folder: Path, fixed: dict, setting: dict | None = None) -> dict[str, dict]:
    """Run name -> record of every record in the sweep's folder whose config has the sweep's fixed values and,
    given this trial's `setting`, carries the same rule (a record from before the rule was kept: its values)."""
    want = {k: normalize(v) for k, v in fixed.items()}
    out = {}
    for path in sorted(folder.glob("*/results.json")):
        record = load_record(path.parent)[0]  # None: unreadable (being written, or broken): not counted
        config = (record or {}).get("config") or {}
        if record and all(k in config and normalize(config[k]) == v for k, v in want.items()) and (
                setting is None or OPTION not in config or same_rule(config[OPTION], setting)):
            out[path.parent.name] = record
    return out


def same_rule(text, setting: dict) -> bool:
    """A record's `run.early_terminate` is this setting: the same sweep's rule, metric and fixed values (a fit
    typed with a rule, and unrelated runs in its folder without one, are not one sweep)."""
    try:
        return normalize(json.loads(text)) == normalize(setting) if isinstance(text, str) else False
    except ValueError:
        return False


def sweep_histories(folder: Path, fixed: dict, metric: str, setting: dict | None = None) -> dict[str, list[float]]:
    """Run name -> metric series of each of the sweep's records (`sweep_records`)."""
    return {name: series(r.get("history") or [], metric) for name, r in sweep_records(folder, fixed, setting).items()}


def point_of(config: dict, replicate: str) -> str:
    """A point's identity: a run's config without its seed and the run's own bookkeeping (run.*)."""
    kept = {k: v for k, v in config.items() if k != replicate and not k.startswith("run.")}
    return json.dumps(normalize(kept), sort_keys=True, default=str)


def mean_curve(histories: list[list[float]]) -> list[float]:
    """A point's history: at each epoch, the mean over its seeds that reached it."""
    length = max(map(len, histories), default=0)
    return [statistics.fmean(h[e] for h in histories if len(h) > e) for e in range(length)]


def point_verdict(rule: Rule, own: list[float], name: str, config: dict, records: dict[str, dict],
                  replicate: str) -> str | None:
    """Why a run of a replicated point stops now (its point judged on mean curves, or a run of it stopped), or None.
    `records`: the sweep's records by run name; this run's own history is `own` (from memory)."""
    points: dict[str, list[list[float]]] = {}
    mine = point_of(config, replicate)
    for other, record in records.items():
        if other == name:
            continue
        key = point_of(record.get("config") or {}, replicate)
        if key == mine and record.get("status") == "stopped_early":
            return f"hyperband: its point was stopped at {replicate}={(record.get('config') or {}).get(replicate)}"
        points.setdefault(key, []).append(series(record.get("history") or [], rule.metric))
    points.setdefault(mine, []).append(own)
    curves = {key: mean_curve(runs) for key, runs in points.items()}
    reason = verdict(rule, curves[mine], list(curves.values()))
    return reason and reason.replace(f"{rule.metric} ", f"{rule.metric} (its point's mean over seeds) ", 1)


class HyperbandStop(pl.Callback):
    """Stops the trial at an epoch's end when the sweep's hyperband rule says so; `reason` says why (None: it ran on).

    Rank 0 reads the records and decides; every rank follows its decision. Put it after the RunRecord, whose
    history (`history()`) then holds this epoch.
    """

    def __init__(self, setting: dict, directory: Path, history, config: dict | None = None):
        self.rule = parse(setting["rule"], setting["metric"])
        self.setting, self.fixed = setting, setting.get("fixed", {})
        self.directory, self.history = Path(directory), history
        self.replicate, self.config = setting.get("replicate"), config or {}
        self.reason: str | None = None

    @classmethod
    def from_option(cls, text: str | None, directory: Path, history, config: dict | None = None) -> HyperbandStop | None:
        """The callback for fit's `run.early_terminate` (checked by `option_error`), or None when it is not set;
        `config`: the run's own (a replicated search judges its point, found by it)."""
        return cls(json.loads(text), directory, history, config) if text else None

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.reason or trainer.sanity_checking:
            return
        reason = self.decide() if trainer.is_global_zero else None
        reason = trainer.strategy.broadcast(reason, src=0)
        if reason:
            self.reason = reason
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"stopped early at epoch {trainer.current_epoch}: {reason}", flush=True)

    def decide(self) -> str | None:
        """This epoch's verdict against the sweep's records (this run's own history from memory)."""
        own = series(self.history(), self.rule.metric)
        if self.replicate and self.config:
            records = sweep_records(self.directory.parent, self.fixed, self.setting)
            return point_verdict(self.rule, own, self.directory.name, self.config, records, self.replicate)
        others = sweep_histories(self.directory.parent, self.fixed, self.rule.metric, self.setting)
        others[self.directory.name] = own
        return verdict(self.rule, own, list(others.values()))
