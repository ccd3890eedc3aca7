"""Check a sweep before any trial starts: structure, known keys, allowed values, allowed cells."""

from __future__ import annotations

import functools
import itertools
import json
import math
from typing import Any

import yaml

from vit_lightning.commands.sweep.expand import METHODS, SWEEP_KEYS, distribution, render_args
from vit_lightning.core.checks import non_finite, suggest
from vit_lightning.core.identity import TRIAL_KEY, flatten, normalize
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES
from vit_lightning.model.vit import INJECTION_OPTION
from vit_lightning.run import hyperband


class SweepError(ValueError):
    """A bad sweep file or option; the message is one line naming the problem and the choices."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml's safe loader, except that a key given twice in one mapping is an error (yaml keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}: each key may appear once", mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str):
    """A sweep file's YAML, rejecting duplicate keys."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def check_structure(config: Any) -> None:
    """Top-level keys, method, metric and command are what `wandb sweep` accepts."""
    if not isinstance(config, dict):
        raise SweepError(f"a sweep must be a mapping of {', '.join(sorted(SWEEP_KEYS))}")
    if unknown := sorted(set(config) - SWEEP_KEYS):
        raise SweepError(f"unknown sweep key {unknown[0]!r}; choose from {', '.join(sorted(SWEEP_KEYS))}")
    if config.get("method") not in METHODS:
        raise SweepError(f"method {config.get('method')!r} is not one of {', '.join(METHODS)}")
    metric = config.get("metric", {})
    goal = metric.get("goal", "minimize") if isinstance(metric, dict) else None
    if not isinstance(metric, dict) or "name" not in metric or goal not in ("minimize", "maximize"):
        raise SweepError("metric must be {name: ..., goal: minimize|maximize}")
    command = config.get("command", [])
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        raise SweepError("command must be a list of strings such as ['${env}', 'vit-ablate', 'fit', '${args}']")
    params = config.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError("sweep needs a non-empty 'parameters' mapping of option -> {value: ...} or {values: [...]}")
    if "early_terminate" in config:
        try:
            hyperband.parse(config["early_terminate"], metric)
        except ValueError as err:
            raise SweepError(str(err)) from None
    if config.get("method") == "bayes":  # else the sampler is told every point failed: a blind search
        try:
            hyperband.check_metric(metric, recorded_metrics(params), "method bayes")
        except ValueError as err:
            raise SweepError(str(err)) from None
    cap = config.get("run_cap")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise SweepError(f"run_cap must be a positive integer, got {cap!r}")


def recorded_metrics(params: dict) -> tuple[str, ...]:
    """The metrics a trial's record holds at its end for these sweep parameters (what a bayes search reads)."""
    from vit_lightning.analysis.fewshot import SHOTS, metric_names
    from vit_lightning.core.names import SHUFFLE_DROP, SHUFFLED_ACC

    def values(key, default):
        spec = params.get(key)
        if not isinstance(spec, dict):
            return [default]
        return [spec["value"]] if "value" in spec else list(spec.get("values") or [default])

    shots = sorted({k for v in values("run.fewshot_shots", list(SHOTS)) if isinstance(v, list) for k in v
                    if isinstance(k, int)})
    shuffled = any(not isinstance(v, int) or v > 0 for v in values("run.shuffle_perms", 1))
    return (*hyperband.METRICS, "epochs", "steps", *[m for k in shots for m in metric_names(k)],
            *((SHUFFLED_ACC, SHUFFLE_DROP) if shuffled else ()))


def edge_values(dist: str, spec: dict) -> list:
    """The values of one parameter that stand for all it can take: every value of a list, a range's two ends, a
    normal's or beta's centre (quantised as the sweep would)."""
    if dist == "constant":
        return [spec["value"]]
    if dist.startswith("categorical"):
        return list(spec["values"])
    if "min" in spec:
        ends = [spec["min"], spec["max"]]
        if dist in ("log_uniform", "q_log_uniform"):  # bounds in log space
            ends = [math.exp(x) for x in ends]
    elif "mu" in spec:
        ends = [math.exp(spec["mu"]) if "log" in dist else spec["mu"]]
    else:
        ends = [spec["a"] / (spec["a"] + spec["b"])]
    return [round(x / spec["q"]) * spec["q"] for x in ends] if dist.startswith("q_") else ends


def check_parameters(params: dict, known: set[str] | None) -> None:
    """Every key is a fit option, and every value the sweep can give it passes fit's own checks (`check_space`)."""
    if not isinstance(params, dict) or not params:
        raise SweepError("sweep needs a non-empty 'parameters' mapping")
    space = {}
    for name in sorted(params):
        if name == TRIAL_KEY:
            raise SweepError(f"{TRIAL_KEY} is handed to each trial by the sweep runner; remove it from the sweep")
        if known is not None and name not in known:
            raise SweepError(f"unknown key {name!r}: not an option of `vit-ablate fit` ({suggest(name, known)})")
        try:
            space[name] = edge_values(*distribution(name, params[name]))
        except ValueError as err:
            raise SweepError(str(err)) from None
    check_space(space)


POSITION = ("model.pos_encoding", f"model.{INJECTION_OPTION}")  # a pair the model allows or not (ModelConfig's rules)


def check_space(space: dict[str, list]) -> None:
    """Each value of each parameter checked as one trial is (`check_trial`: fit's parser, the data module's and the
    model's own checks), the other parameters at their first value; every position encoding x injection pair too.
    Nothing here restates a rule: a value is good when fit would take it."""
    base = {name: values[0] for name, values in space.items()}
    variants = [{name: value} for name, values in space.items() for value in values[1:]]
    if all(key in space for key in POSITION):
        variants += [dict(zip(POSITION, pair)) for pair in itertools.product(*(space[key] for key in POSITION))]
    for changed in [{}, *variants]:
        try:
            check_trial(render_args({**base, **changed}))
        except SweepError as err:
            label = " with ".join(f"{key}={value}" for key, value in changed.items())
            raise SweepError(f"{label}: {err}" if label else str(err)) from None


@functools.lru_cache(maxsize=1)
def fit_parser():
    """The real `vit-ablate fit` parser (train.fit_parser), built once per sweep command."""
    from vit_lightning.commands.fit.cli import fit_parser as build

    return build()


def known_keys() -> set[str]:
    """Every dotted option `vit-ablate fit` accepts (the sweep's parameter names)."""
    return {k for k in fit_parser().get_defaults().keys() if k != "config"}


def check_trial(args: list[str]) -> None:
    """One trial's `${args}` as fit would take them: types, choices, a budget that trains, data options the data
    module takes, a model that builds (no data read, no memory used)."""
    from vit_lightning.commands.fit.settings import settings_error
    from vit_lightning.data.datamodule import check_options

    namespace = parse_trial(args)
    adopt_source(namespace, args)
    flat = {key: normalize(value) for key, value in flatten(namespace.as_dict()).items()}
    if error := non_finite(namespace.as_dict()) or settings_error(flat):
        raise SweepError(error)
    try:
        check_options(**namespace.data.as_dict())
    except ValueError as err:
        raise SweepError(" ".join(str(err).split())) from None
    check_model(namespace)


def adopt_source(namespace, args: list[str]) -> None:
    """A trial started from a finished run or checkpoint gets that source's architecture, as fit gives it.

    A source still to be trained is left to `trials.missing_sources`; a timm source is not downloaded here.
    """
    from vit_lightning.run import transfer

    text = namespace.get("model.init_from")
    if not text or transfer.source_kind(text) == "timm" or transfer.source_problem(text):
        return
    try:
        transfer.adopt(namespace, fit_parser().get_defaults(), list(args))
    except transfer.SourceError as err:
        raise SweepError(str(err)) from None


def parse_trial(args: list[str]):
    """One trial's `${args}` parsed by the fit parser (types, Literal choices), instantiating nothing.

    A rejected value is named by the option that fails alone (`--key=value` as the sweep wrote it), with
    jsonargparse's own explanation on the same line.
    """
    parser = fit_parser()
    try:
        return parser.parse_args(list(args))
    except Exception as err:  # jsonargparse's ArgumentError carries no field naming the option
        whole = err
    for arg in args:
        try:
            parser.parse_args([arg])
        except Exception as err:
            option = arg[2:] if arg.startswith("--") else arg
            raise SweepError(f"{option} is not valid: {' '.join(str(err).split())}"[:300]) from None
    raise SweepError(" ".join(str(whole).split())[:300]) from None


def data_shape(data: dict) -> dict[str, Any]:
    """The model options `fit` links from the data (train.LINKED), from the dataset's facts alone: no files read."""
    from vit_lightning.data.datamodule import SOURCES

    source = SOURCES[data["name"]]
    # an image folder's class count is known only from disk; any count builds the same shapes
    return {"img_size": data.get("img_size") or source.native_size, "in_chans": source.in_chans,
            "num_classes": getattr(source, "num_classes", 2)}


def check_model(namespace) -> None:
    """The trial's LightningModule builds with the data's shape (a patch size that divides the image, ...)."""
    options = {**namespace.model.as_dict(), **data_shape(namespace.data.as_dict())}
    if options.get("patch_size") is None:  # as fit fills it in
        options["patch_size"] = FAMILIES[options.get("arch") or DEFAULT_ARCH].demo_patch
    if error := _model_error(json.dumps(options, sort_keys=True)):
        raise SweepError(error)


@functools.lru_cache(maxsize=256)
def _model_error(options: str) -> str | None:
    """Build the module on the meta device (every check of the model runs, no memory is used); its error or None."""
    import torch

    from vit_lightning.run.module import Classifier

    try:
        with torch.device("meta"):
            Classifier(**json.loads(options))
    except ValueError as err:
        return " ".join(str(err).split())
    return None


def machine_check(configs: list[dict], trial_params: list[dict], gpus: int, share_cpus: bool = False,
                  sampled: tuple[str, ...] = ("bayes",)) -> None:
    """Every trial (one of a sweep whose method is in `sampled` by its first values) can run on this machine: its
    accelerator, devices, loader workers (unless slots share the CPUs out) and data, checked once per distinct
    setting; SweepError otherwise."""
    from vit_lightning.run import machine

    defaults = flatten({k: v for k, v in fit_parser().get_defaults().as_dict().items() if k != "config"})
    bayes = [{name: edge_values(*distribution(name, spec))[0] for name, spec in c["parameters"].items()}
             for c in configs if c.get("method") in sampled]
    found: dict[str, int] = {}
    problems: dict[str, str | None] = {}
    everything = [*trial_params, *bayes]
    for params in everything:
        flat = {key: normalize(value) for key, value in {**defaults, **params}.items()}
        if share_cpus:
            flat["data.num_workers"] = 0  # each slot's share of the CPUs caps them (supervise.slot_envs)
        setting = json.dumps({k: v for k, v in flat.items() if k.startswith(("data.", "trainer."))}, sort_keys=True,
                             default=str)
        if setting not in problems:
            problems[setting] = machine.problem(flat, gpus=gpus)
        if line := problems[setting]:
            found[line] = found.get(line, 0) + 1
    if found:
        line, count = next(iter(found.items()))
        raise SweepError(f"{sum(found.values())} of {len(everything)} trials cannot run on this machine: {line}")
