"""`vit-ablate sweep` (run an ablation's sweep locally or on W&B agents) and `vit-ablate sweeps` (regenerate sweeps/)."""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from vit_lightning.commands.sweep import (
    jobscript,
    local,
    preview,
    repair,
    select,
    supervise,
    trials,
    validate,
    wandb_backend,
    yamls,
)
from vit_lightning.commands.sweep.validate import SweepError
from vit_lightning.compat.wandb import env_mode
from vit_lightning.core.identity import TRIAL_KEY
from vit_lightning.core.names import SEED_KEY
from vit_lightning.core.parser import CommandParser

EPILOG = """\
examples:
  vit-ablate sweep pos_encoding                          # demo profile, local backend, one trial after another
  vit-ablate sweep pos_encoding --dry-run                # count, folder, each trial's state; commands to run
  vit-ablate sweep cls_vs_gap --profile cifar10 --parallel 4          # 4 trials at once, 1/4 of the GPUs each
  vit-ablate sweep pos_encoding --profile cifar10 --trials-per-gpu 3  # 3 trials on each GPU at once
  vit-ablate sweep sweeps/patch_size-demo.yaml --set trainer.max_epochs=1
  vit-ablate sweep pos_encoding --profile imagenet --backend wandb --gpus-per-agent 8
  vit-ablate sweep pos_encoding --profile imagenet --backend wandb --gpus-per-agent 2 --agents 4 --print-sbatch > job.sh
backend auto: wandb when W&B credentials exist (WANDB_API_KEY, or `wandb login [--host URL]`), else local.
GPU profiles set trainer.devices=auto: a trial uses every GPU of its group (--parallel / --gpus-per-agent).
"""

STAGGER_S = 5.0  # the wandb backend's seconds between agent starts, unless --stagger
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # exponent without a dot: YAML 1.1 leaves it a string


def parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate sweep", description=__doc__.split("\n")[0], epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="+", metavar="NAME_OR_YAML", help="ablation name(s) or sweep YAML file(s)")
    p.add_argument("--profile", help="profile of a named ablation (default: demo)")
    p.add_argument("--backend", choices=("auto", "local", "wandb"), default="auto")
    p.add_argument("--dry-run", action="store_true",
                   help="print the trials' count, their records' folder and each one's state (done, to run, failed), "
                        "with the command line of each trial to run; run nothing")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting for every trial (repeatable), e.g. trainer.max_epochs=1")
    p.add_argument("--count", type=positive, help="at most N trials (random sweeps need this or run_cap)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of a local random sweep")
    p.add_argument("--ablations-dir", type=Path, metavar="DIR", help="also load ablations from DIR/<name>.py")
    p.add_argument("--trials-per-gpu", type=positive, default=1, metavar="N",
                   help="N trials share each GPU (group): N local slots or N W&B agents per group, each with its "
                        "share of the CPUs for loader workers (small models leave a GPU mostly idle); refused where no GPU is "
                        "visible (on the CPU: --parallel N)")
    p.add_argument("--extend-edges", action="store_true",
                   help="a selection stage (transfer's *_select): train each cell whose best value is the largest or "
                        "smallest tried at the next value past that edge, stepping as the grid does (0.2, 0.4 -> 0.8), "
                        "and no other trial; cells whose best is interior are left as they are")
    p.add_argument("--trial-config", type=int, metavar="N",
                   help="print trial N's full fit config (YAML for `vit-ablate fit --config`, e.g. under srun); "
                        "run nothing")
    local_ = p.add_argument_group("local backend")
    local_.add_argument("--parallel", type=positive, metavar="K",
                        help="K trials at once, each on 1/K of the visible GPUs (or of the CPU threads); default 1, "
                             "or with --trials-per-gpu one group per GPU")
    local_.add_argument("--retry-failed", action="store_true", help="run failed trials again")
    local_.add_argument("--seeds-per-point", type=positive, metavar="K",
                        help="bayes: train each proposed point at seeds 0..K-1 and tell the search their mean "
                             "(replaces the sweep's seed values; run_cap and --count count runs)")
    local_.add_argument("--confirm", type=confirm_pair, metavar="M,N",
                        help="bayes: once the search is done, train its top M points (by their mean) on to N seeds "
                             "(default: the profile's `confirm`)")
    local_.add_argument("--repair", action="store_true",
                        help="rebuild a damaged bayes journal from the records (a damaged sweep state is rebuilt "
                             "from them by every run)")
    local_.add_argument("--fresh-processes", action="store_true",
                        help="start each trial as a new `vit-ablate fit` process instead of forking it from a worker "
                             "that imported torch and Lightning once per slot (about 5 s more per trial)")
    remote = p.add_argument_group("wandb backend")
    remote.add_argument("--project", default="vit-lightning")
    remote.add_argument("--entity")
    remote.add_argument("--agents", type=int, metavar="N", help="agents to start (default: visible GPUs / K)")
    remote.add_argument("--gpus-per-agent", type=int, metavar="K", help="GPUs per agent = DDP width per trial (default 1)")
    remote.add_argument("--stagger", type=float, default=STAGGER_S, metavar="S", help="seconds between agent starts")
    remote.add_argument("--sweep-id", action="append", default=[], metavar="ID",
                        help="join existing sweep(s) [ENTITY/PROJECT/]ID instead of creating them (other nodes)")
    p.add_argument("--print-sbatch", action="store_true",
                   help="print a SLURM job script that runs this sweep on a node (wandb: whose agents join the sweeps, "
                        "found or created now; local: whose array tasks share the run root); start nothing")
    return p


def confirm_pair(text: str) -> tuple[int, int]:
    """An argparse type: M,N (the top M points confirmed at N seeds), two positive integers."""
    parts = text.split(",")
    if len(parts) != 2 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(f"expected M,N (top M points at N seeds, e.g. 2,5), got {text!r}")
    return int(parts[0]), int(parts[1])


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
    """KEY=VALUE with VALUE read as YAML (1 -> int, true -> bool, [1, 2] -> list, /data -> str, 1e-3 -> float).

    null is refused: W&B's agent passes a trial's values as `--key=str(value)`, so it would arrive as "None".
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SweepError(f"--set expects KEY=VALUE, got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, str) and NUMBER.fullmatch(parsed.strip()):
        parsed = float(parsed)  # YAML 1.1 reads 1e-3 (no dot) as a string
    if parsed is None:
        raise SweepError(f"--set {text}: a sweep cannot pass null (W&B's agent would hand fit the string None); "
                         f"leave {key.strip()} out to use fit's default")
    return key.strip(), parsed


RECORDED_ONLY = ("run.fewshot_shots", "run.fewshot_every")  # fit options that change the record, not the training


def prepare(args) -> list[dict]:
    """Load, override and validate every sweep config, before any trial starts."""
    configs = load_configs(args.targets, args.profile, args.ablations_dir)
    known = validate.known_keys()
    overrides = [parse_override(o) for o in args.overrides]
    for key, _ in overrides:
        if key in RECORDED_ONLY:  # not part of a trial's name (identity.NOT_IDENTITY): a finished trial stays done
            print(f"vit-ablate sweep: --set {key} changes what a trial records, not what it trains: trials keep "
                  "their names, and finished ones are not trained again for it (add --set run.retrain=true to "
                  "train them again)", file=sys.stderr, flush=True)
    prepared = []
    for label, config in configs:
        config = copy.deepcopy(config)
        try:
            validate.check_structure(config)
            for key, value in overrides:
                if key not in known:
                    raise SweepError(f"--set {key}: unknown key ({validate.suggest(key, known)})")
                config["parameters"][key] = {"value": value}
            if args.seeds_per_point and config.get("method") == "bayes":  # each point at seeds 0..K-1
                config["parameters"][SEED_KEY] = {"values": list(range(args.seeds_per_point))}
            if "early_terminate" in config:  # the rule a trial's command carries, with the sweep's settings as now
                config["command"] = trials.early_command(config)
        except SweepError as err:
            raise SweepError(f"{label}: {err}") from None
        prepared.append((label, config))
    if args.extend_edges:
        prepared = extended(prepared, args.ablations_dir)
    options = f" --ablations-dir {args.ablations_dir}" if args.ablations_dir else ""
    select.resolve([config for _, config in prepared], args.ablations_dir, options)  # a `select:` value, chosen
    for label, config in prepared:
        try:
            validate.check_parameters(config["parameters"], known)
        except SweepError as err:
            raise SweepError(f"{label}: {err}") from None
    return [config for _, config in prepared]


def extended(prepared: list[tuple[str, dict]], directory: Path | None) -> list[tuple[str, dict]]:
    """--extend-edges: the selection stage's configs cut to each edge cell's next value, what each cell adds said."""
    try:
        configs, lines = select.extend_edges([config for _, config in prepared], directory)
    except ValueError as err:  # SweepError is one; an unknown ablation or profile too
        raise SweepError(str(err) if isinstance(err, SweepError) else f"--extend-edges: {err}") from None
    for line in lines:
        print(f"vit-ablate sweep: --extend-edges: {line}", file=sys.stderr, flush=True)
    if not configs:
        print("vit-ablate sweep: --extend-edges: every cell's best lies inside the values tried: nothing to train",
              file=sys.stderr, flush=True)
    return [(config["name"], config) for config in configs]


def checked_trials(configs: list[dict], args, gpus: int = 0) -> list[trials.Trial]:
    """All trials, each seeing `gpus` GPUs, checked as fit would check them (types, choices, shapes) before any runs."""
    try:
        all_trials = trials.build(configs, count=args.count, seed=args.seed, gpus=gpus)
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


def check_sources(all_trials: list[trials.Trial], args) -> None:
    """Trials started from other runs (model.init_from) start only once those runs have finished."""
    options = f" --ablations-dir {args.ablations_dir}" if args.ablations_dir else ""
    if line := trials.missing_sources(all_trials, options):
        raise SweepError(line)


def local_groups(args) -> list[list[str]]:
    """The local backend's GPU groups: --parallel K splits the visible GPUs (--trials-per-gpu alone: one per GPU)."""
    groups = args.parallel or (None if args.trials_per_gpu > 1 else 1)
    gpus = supervise.visible_gpus()
    if args.trials_per_gpu > 1 and not gpus:  # N slots would share no GPU: N trials at once on the CPU, unasked
        raise SweepError(f"--trials-per-gpu {args.trials_per_gpu}: no GPU is visible here (CUDA_VISIBLE_DEVICES, "
                         f"torch); on the CPU use --parallel {args.trials_per_gpu} to run that many trials at once")
    try:
        return supervise.split_gpus(gpus, groups=groups)
    except ValueError as err:
        raise SweepError(f"--parallel {args.parallel}: {err}") from None


def bayes_searches(configs: list[dict], args, gpus: int) -> list:
    """The local backend's bayes searches (search.Search), one per bayes config; SweepError on bad settings."""
    from vit_lightning.commands.sweep import search

    return search.searches(configs, args.count, args.seed, gpus, args.retry_failed, SweepError,
                           confirm=lambda config: args.confirm or profile_confirm(config, args.ablations_dir))


def profile_confirm(config: dict, directory: Path | None) -> tuple[int, int] | None:
    """The confirmation stage (top m, n seeds) of the profile a sweep names (run.ablation, run.profile), if any."""
    from vit_lightning.ablation import load

    names = [(config["parameters"].get(k) or {}).get("value") for k in ("run.ablation", "run.profile")]
    if not all(isinstance(n, str) for n in names):
        return None
    try:
        prof = load(names[0], directory).profile(names[1])
    except (ValueError, KeyError, FileNotFoundError):
        return None  # a sweep file of an ablation not here: no profile to read it from
    confirm = (prof.search or {}).get("confirm")
    return (confirm["top"], confirm["seeds"]) if confirm else None


def run_local(all_trials: list[trials.Trial], groups: list[list[str]], args, searches=()) -> int:
    slots = supervise.slot_envs(groups, per_group=args.trials_per_gpu)
    return local.Runner(all_trials, slots, retry_failed=args.retry_failed, fork=not args.fresh_processes,
                        searches=searches).run()


def print_local_sbatch(configs: list[dict], args) -> int:
    """A job script whose array tasks run the local backend on this run root (a filesystem every node shares)."""
    parallel = args.parallel or 1
    gpus = parallel if uses_gpus(configs) else 0  # one GPU per group, as --parallel splits the job's GPUs
    checked_trials(configs, args, gpus=1 if gpus else 0)  # every trial checked now, as the job will check them
    searches = bayes_searches(configs, args, gpus=1 if gpus else 0)
    repair.check([], searches, args.repair, True, log=lambda m: print(m.replace("without --dry-run", "in the job"),
                                                                    file=sys.stderr))
    flags = [flag for flag, on in (("--retry-failed", args.retry_failed), ("--fresh-processes", args.fresh_processes),
                                   ("--repair", args.repair), ("--extend-edges", args.extend_edges)) if on]
    options = [("--parallel", parallel), ("--trials-per-gpu", per_gpu_option(args)),
               ("--seed", args.seed or None),  # a random or bayes sweep's draws
               ("--seeds-per-point", args.seeds_per_point), ("--confirm", args.confirm and ",".join(map(str, args.confirm)))]
    argv = job_argv(args, "local", options, flags)
    name = job_name(args)
    shares = ("Every task of this script (sbatch --array=1-N) takes the trials no other live process holds "
              "on this run root.")
    cpus = job_cpus(configs, parallel, 1, args.trials_per_gpu)
    return print_lines([jobscript.sbatch_script(argv, name, gpus, cpus, shares)])


def run_wandb(configs: list[dict], args) -> int:
    """Join (or create) the W&B sweeps and run agents on this machine's GPU groups, or print a job script doing so."""
    if args.print_sbatch and uses_gpus(configs):  # for the job's node, not this login node: from the options alone
        per = args.gpus_per_agent or 1
        groups = [[str(i) for i in range(k * per, (k + 1) * per)] for k in range(args.agents or 1)]
    else:
        try:
            groups = supervise.split_gpus(supervise.visible_gpus(), groups=args.agents, per_group=args.gpus_per_agent)
        except ValueError as err:
            raise SweepError(f"--agents/--gpus-per-agent: {err}") from None
    grid = checked_trials([c for c in configs if c.get("method") == "grid"], args, gpus=len(groups[0]))
    check_sources(grid, args)
    wandb_backend.check_devices(configs, len(groups[0]))
    if not args.print_sbatch:  # the agents train here: what the trials ask of this machine, before any sweep exists
        validate.machine_check(configs, [t.params for t in grid], len(groups[0]), args.trials_per_gpu > 1,
                               sampled=("bayes", "random"))
    if env_mode() in ("disabled", "offline"):  # credentials or not, wandb itself would refuse to reach the server
        raise SweepError(f"the wandb backend needs the W&B server, but WANDB_MODE={os.environ['WANDB_MODE']}: "
                         "unset it, or use --backend local")
    if not wandb_backend.has_credentials():
        raise SweepError("the wandb backend needs W&B credentials: run `wandb login` (self-hosted W&B: "
                         "`wandb login --host URL`) or set WANDB_API_KEY")
    try:
        paths = args.sweep_id or wandb_backend.find_or_create_sweeps(configs, args.project, args.entity)
    except Exception as err:  # unreachable server, refused key, unknown entity: one line, nothing started
        text = " ".join(str(err).split()) or type(err).__name__
        raise SweepError(f"W&B could not find or create the sweeps: {text[:300]}") from None
    if args.print_sbatch:
        gpus = (args.agents or 1) * (args.gpus_per_agent or 1) if uses_gpus(configs) else 0
        name = job_name(args)
        cpus = job_cpus(configs, args.agents or 1, args.gpus_per_agent or 1, args.trials_per_gpu)
        shares = "Every job (and array task) of this script joins the same W&B sweeps, each on its own node."
        entity = args.entity or (paths[0].split("/")[0] if paths and paths[0].count("/") == 2 else None)
        argv = job_argv(args, "wandb", [("--project", args.project), ("--entity", entity), ("--agents", args.agents),
                                        ("--gpus-per-agent", args.gpus_per_agent),
                                        ("--trials-per-gpu", per_gpu_option(args)),
                                        ("--stagger", args.stagger if args.stagger != STAGGER_S else None),
                                        *(("--sweep-id", path) for path in paths)])
        return print_lines([jobscript.sbatch_script(argv, name, gpus, cpus, shares)])
    agents = wandb_backend.agent_commands(paths, groups, args.count, wandb_backend.wandb_command(), args.trials_per_gpu)
    return wandb_backend.run_agents(agents, args.stagger)


def job_cpus(configs: list[dict], agents: int, gpus_per_agent: int, per_gpu: int = 1) -> int:
    """CPUs a node of the job script needs: each training process's loader workers (data.num_workers, split among
    the trials sharing a GPU) plus itself; the sweep then gives each slot that share (supervise.loader_share)."""
    workers = int(max((c["parameters"].get("data.num_workers", {}).get("value") or 0 for c in configs), default=0))
    share = max(1, workers // per_gpu) if workers else 0
    return agents * gpus_per_agent * per_gpu * (share + 1)


def slot_lines(groups: list[list[str]], per_gpu: int) -> list[str]:
    """The local backend's slots as comment lines: what each one adds to its trials' environment."""
    envs = supervise.slot_envs(groups, per_group=per_gpu)
    return [f"# slot {k}: " + " ".join(f"{key}={value}" for key, value in env.items()) for k, env in enumerate(envs, 1)]


def per_gpu_option(args) -> int | None:
    """--trials-per-gpu for a job script's command (None, left out, at its default)."""
    return args.trials_per_gpu if args.trials_per_gpu > 1 else None


def job_name(args) -> str:
    """A job script's SLURM job name: vit-<targets>[-<profile>]."""
    return "vit-" + "-".join(Path(t).stem for t in args.targets) + (f"-{args.profile}" if args.profile else "")


def uses_gpus(configs: list[dict]) -> bool:
    """Some sweep trains on GPUs (its trainer.accelerator is not cpu)."""
    return any(c["parameters"].get("trainer.accelerator", {}).get("value") != "cpu" for c in configs)


def job_argv(args, backend: str, options: list[tuple[str, Any]], flags: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The `vit-ablate sweep` command a job script runs: this command's sweeps, profile, count, ablations folder
    and --set, with the backend's own options (None: left out) and flags."""
    argv = [*jobscript.vit_ablate_command(), "sweep", *args.targets, "--backend", backend]
    options = [("--profile", args.profile), ("--count", args.count),
               ("--ablations-dir", args.ablations_dir and args.ablations_dir.resolve()), *options]
    argv += [str(x) for key, value in options if value is not None for x in (key, value)]
    return [*argv, *flags, *(x for override in args.overrides for x in ("--set", override))]


def print_trial_config(all_trials: list[trials.Trial], number: int) -> int:
    """Print one trial's full `vit-ablate fit` config; without a run name, so fit names it by its own world size."""
    from vit_lightning.commands.fit import main as train

    if not 1 <= number <= len(all_trials):
        raise SweepError(f"--trial-config {number}: the sweep has trials 1 to {len(all_trials)} (see --dry-run)")
    argv = [arg for arg in all_trials[number - 1].args if not arg.startswith(f"--{TRIAL_KEY}=")]
    return train.main([*argv, "--print_config"])


def described(search) -> str:
    """A bayes search's line for --dry-run; a damaged journal (reported already, --repair given) says so instead."""
    try:
        return search.describe()
    except ValueError:
        return f"bayes search {search.journal.name}: journal damaged; --repair without --dry-run rebuilds it"


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
        if args.extend_edges and not configs:
            return 0
        if args.trial_config is not None:
            return print_trial_config(checked_trials(configs, args), args.trial_config)
        backend = args.backend
        if backend == "auto":
            backend = "wandb" if wandb_backend.has_credentials() and not args.dry_run else "local"
        if backend == "local" and args.print_sbatch and not args.dry_run:
            return print_local_sbatch(configs, args)
        if args.dry_run or backend == "local":
            groups = local_groups(args)
            all_trials = trials.with_evaluations(checked_trials(configs, args, gpus=len(groups[0])), args.ablations_dir)
            searches = bayes_searches(configs, args, gpus=len(groups[0]))
            if not args.dry_run:  # trials run here: what they ask of the machine, before anything is written
                validate.machine_check(configs, [t.params for t in all_trials], len(groups[0]), args.trials_per_gpu > 1)
            repair.check(all_trials, searches, args.repair, args.dry_run, log=lambda m: print(m, file=sys.stderr))
            if args.dry_run:
                slots = slot_lines(groups, args.trials_per_gpu) if args.trials_per_gpu > 1 else []
                projected = [f"# projected ({a}, profile {p}): {prof.projected}" for (a, p), prof
                             in trials.profiles_of(all_trials, args.ablations_dir).items() if prof and prof.projected]
                return print_lines(preview.lines(all_trials, args.retry_failed) + [f"# {described(s)}" for s in searches]
                                   + slots + projected)
            check_sources(all_trials, args)
            return run_local(all_trials, groups, args, searches)
        if args.confirm:
            raise SweepError("--confirm is the local backend's (W&B has no confirmation stage): use --backend local, "
                             "or train the chosen points at the remaining seeds yourself")
        return run_wandb(configs, args)
    except SweepError as err:
        print(f"vit-ablate sweep: error: {err}", file=sys.stderr)
        return 2


def write_main(argv: list[str] | None = None) -> int:
    """`vit-ablate sweeps [--check] [--out DIR]`: regenerate the sweep YAMLs from the ablations."""
    from vit_lightning.ablation import source_checkout

    checkout = source_checkout()
    p = CommandParser(prog="vit-ablate sweeps", description=write_main.__doc__)
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
