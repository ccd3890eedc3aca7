"""`vit-ablate sweep` (run an ablation's sweep locally or on W&B agents) and `vit-ablate sweeps` (regenerate sweeps/)."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import yaml

from vit_lightning.sweep import local, supervise, trials, validate, wandb_backend, yamls
from vit_lightning.sweep.validate import SweepError

EPILOG = """\
examples:
  vit-ablate sweep pos_encoding                          # demo profile, local backend, one trial after another
  vit-ablate sweep pos_encoding --dry-run                # print every trial's command line
  vit-ablate sweep cls_vs_gap --profile cifar10 --parallel 4          # 4 trials at once, 1/4 of the GPUs each
  vit-ablate sweep sweeps/patch_size-demo.yaml --set trainer.max_epochs=1
  vit-ablate sweep pos_encoding --profile imagenet --backend wandb --gpus-per-agent 8
backend auto: wandb when W&B credentials exist (WANDB_API_KEY or a netrc entry), else local.
GPU profiles set trainer.devices=auto: a trial uses every GPU of its group (--parallel / --gpus-per-agent).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vit-ablate sweep", description=__doc__.split("\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="+", metavar="NAME_OR_YAML", help="ablation name(s) or sweep YAML file(s)")
    p.add_argument("--profile", help="profile of a named ablation (default: demo)")
    p.add_argument("--backend", choices=("auto", "local", "wandb"), default="auto")
    p.add_argument("--dry-run", action="store_true", help="print every trial's command line; run nothing")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting for every trial (repeatable), e.g. trainer.max_epochs=1")
    p.add_argument("--count", type=positive, help="at most N trials (random sweeps need this or run_cap)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of a local random sweep")
    p.add_argument("--ablations-dir", type=Path, metavar="DIR", help="also load ablations from DIR/<name>.py")
    local_ = p.add_argument_group("local backend")
    local_.add_argument("--parallel", type=positive, default=1, metavar="K",
                        help="K trials at once, each on 1/K of the visible GPUs (or of the CPU threads)")
    local_.add_argument("--retry-failed", action="store_true", help="run failed trials again")
    remote = p.add_argument_group("wandb backend")
    remote.add_argument("--project", default="vit-lightning")
    remote.add_argument("--entity")
    remote.add_argument("--agents", type=int, metavar="N", help="agents to start (default: visible GPUs / K)")
    remote.add_argument("--gpus-per-agent", type=int, metavar="K", help="GPUs per agent = DDP width per trial (default 1)")
    remote.add_argument("--stagger", type=float, default=5.0, metavar="S", help="seconds between agent starts")
    remote.add_argument("--sweep-id", action="append", default=[], metavar="ID",
                        help="join existing sweep(s) [ENTITY/PROJECT/]ID instead of creating them (other nodes)")
    remote.add_argument("--print-agent-cmd", action="store_true",
                        help="create the sweeps, print one agent command per GPU group (for sbatch), start nothing")
    return p


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def read_yaml(path: Path) -> dict:
    """A sweep file; malformed YAML -> one line naming the file and where."""
    try:
        config = validate.load_yaml(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SweepError(f"{path}: malformed YAML{where}: {getattr(err, 'problem', None) or err}") from None
    except OSError as err:
        raise SweepError(f"{path}: {err.strerror}") from None
    return config


def load_configs(targets: list[str], profile: str | None, directory: Path | None = None) -> list[tuple[str, dict]]:
    """(label, sweep config) for every target: a YAML file, or every grid block of a named ablation."""
    from vit_lightning.ablation import available, load

    try:
        names = available(directory)
    except ValueError as err:
        raise SweepError(str(err)) from None
    out = []
    for target in targets:
        path = Path(target)
        if path.suffix in (".yaml", ".yml") or path.is_file():
            if profile:
                raise SweepError("--profile applies to ablation names; a sweep file names its profile in run.profile")
            out.append((str(path), read_yaml(path)))
            continue
        if target not in names:
            raise SweepError(f"{target!r} is neither a sweep file nor an ablation; ablations: {', '.join(names)}")
        try:
            out += yamls.sweep_configs(load(target, directory), profile or "demo")
        except ValueError as err:
            raise SweepError(str(err)) from None
    return out


def parse_override(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as YAML (1 -> int, true -> bool, [1, 2] -> list, /data -> str)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SweepError(f"--set expects KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        return key.strip(), value


def prepare(args) -> list[dict]:
    """Load, override and validate every sweep config, before any trial starts."""
    configs = load_configs(args.targets, args.profile, args.ablations_dir)
    known = validate.known_keys()
    overrides = [parse_override(o) for o in args.overrides]
    prepared = []
    for label, config in configs:
        config = copy.deepcopy(config)
        try:
            validate.check_structure(config)
            for key, value in overrides:
                if key not in known:
                    raise SweepError(f"--set {key}: unknown key ({validate.suggest(key, known)})")
                config["parameters"][key] = {"value": value}
            validate.check_parameters(config["parameters"], known)
        except SweepError as err:
            raise SweepError(f"{label}: {err}") from None
        prepared.append(config)
    return prepared


def checked_trials(configs: list[dict], args) -> list[trials.Trial]:
    """All trials, each checked as fit would check it (types, choices, model shapes) before any runs."""
    try:
        all_trials = trials.build(configs, count=args.count, seed=args.seed)
    except ValueError as err:
        raise SweepError(str(err)) from None
    swept = trials.swept_keys(all_trials)
    for k, trial in enumerate(all_trials, 1):
        try:
            validate.check_trial(list(trial.args))
        except SweepError as err:
            label = " ".join(f"{key}={trial.params[key]}" for key in swept)
            raise SweepError(f"trial {k} of {len(all_trials)}" + (f" ({label})" if label else "") + f": {err}") from None
    return all_trials


def run_local(all_trials: list[trials.Trial], args) -> int:
    gpus = supervise.visible_gpus() if args.parallel > 1 else []
    try:
        slots = supervise.slot_envs(supervise.split_gpus(gpus, groups=args.parallel))
    except ValueError as err:
        raise SweepError(f"--parallel {args.parallel}: {err}") from None
    return local.Runner(all_trials, slots, retry_failed=args.retry_failed).run()


def run_wandb(configs: list[dict], args) -> int:
    checked_trials([c for c in configs if c.get("method") == "grid"], args)  # check every grid trial first
    try:
        groups = supervise.split_gpus(supervise.visible_gpus(), groups=args.agents, per_group=args.gpus_per_agent)
    except ValueError as err:
        raise SweepError(f"--agents/--gpus-per-agent: {err}") from None
    wandb_backend.check_devices(configs, len(groups[0]))
    if not args.sweep_id and not wandb_backend.has_credentials():
        raise SweepError("the wandb backend needs W&B credentials: run `wandb login` or set WANDB_API_KEY")
    paths = args.sweep_id or wandb_backend.create_sweeps(configs, args.project, args.entity)
    agents = wandb_backend.agent_commands(paths, groups, args.count, wandb_backend.wandb_command(),
                                          forward_signals=wandb_backend.agent_forwards_signals())
    if args.print_agent_cmd:
        return print_lines([agent.shell() for agent in agents])
    return wandb_backend.run_agents(agents, args.stagger)


def print_lines(lines: list[str]) -> int:
    """Print to stdout; a closed pipe (`| head`) is not an error."""
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


def main(argv: list[str] | None = None) -> int:
    """`vit-ablate sweep NAME_OR_YAML ... [options]`."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        configs = prepare(args)
        backend = args.backend
        if backend == "auto":
            backend = "wandb" if wandb_backend.has_credentials() and not args.dry_run else "local"
        if args.dry_run or backend == "local":
            all_trials = checked_trials(configs, args)
            if args.dry_run:
                return print_lines([t.shell() for t in all_trials])
            return run_local(all_trials, args)
        return run_wandb(configs, args)
    except SweepError as err:
        print(f"vit-ablate sweep: error: {err}", file=sys.stderr)
        return 2


def write_main(argv: list[str] | None = None) -> int:
    """`vit-ablate sweeps [--check] [--out DIR]`: regenerate the sweep YAMLs from the ablations."""
    from vit_lightning.ablation import source_checkout

    checkout = source_checkout()
    p = argparse.ArgumentParser(prog="vit-ablate sweeps", description=write_main.__doc__)
    p.add_argument("--out", type=Path, default=checkout / "sweeps" if checkout else Path("sweeps"),
                   help="output directory (default: sweeps/ of this source checkout, else ./sweeps)")
    p.add_argument("--check", action="store_true", help="exit 1 if the files are out of date; write nothing")
    p.add_argument("--ablations-dir", type=Path, metavar="DIR", help="also write the sweeps of DIR/<name>.py")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        want = yamls.expected_files(directory=args.ablations_dir)
    except ValueError as err:
        print(f"vit-ablate sweeps: error: {err}", file=sys.stderr)
        return 2
    out = args.out
    if args.check:
        stale = yamls.out_of_sync(out, want)
        if stale:
            print(f"vit-ablate sweeps: out of date in {out}: {', '.join(stale)}; run `vit-ablate sweeps`", file=sys.stderr)
        return 1 if stale else 0
    changed = yamls.write(out, want)
    print(f"vit-ablate sweeps: {len(changed)} file(s) updated in {out}" + (f": {', '.join(changed)}" if changed else ""))
    return 0
