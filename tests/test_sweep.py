"""Sweeps: ablations -> W&B YAMLs (in sync), W&B grid/random semantics, validation, dry-run, agents."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from pathlib import Path

import pytest
import yaml

from vit_lightning.ablation import available, load
from vit_lightning.commands.sweep import cli, expand, wandb_backend, yamls
from vit_lightning.commands.sweep.expand import render_args
from vit_lightning.run import hyperband

REPO = Path(__file__).resolve().parent.parent


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of `vit-ablate sweep ...`."""
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def write_sweep(tmp_path, params, **extra) -> str:
    config = {"method": "grid", "metric": {"name": "val/acc_best", "goal": "maximize"},
              "command": yamls.COMMAND, "parameters": params, **extra}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


# --- ablations and generated YAMLs -------------------------------------------------------------------
def test_sweep_yamls_in_sync_with_ablations():
    stale = yamls.out_of_sync(REPO / "sweeps")
    assert not stale, f"run `vit-ablate sweeps`: {stale}"


def test_every_ablation_has_demo_and_gpu_profiles():
    assert set(available()) >= {"pos_encoding", "cls_vs_gap", "patch_size", "hybrid", "swin"}
    for name in available():
        ablation = load(name)
        # the paper's ablations run on CIFAR-10 and ImageNet; a benchmark of its own data has its own GPU profile
        gpu = {name for name, prof in ablation.profiles.items() if prof.fixed["trainer.accelerator"] == "gpu"}
        assert "demo" in ablation.profiles and ({"cifar10", "imagenet"} <= gpu or name == "pos_diagnostic" and gpu)
        assert ablation.metric == "val/acc_best" and ablation.doc and "vit-ablate sweep" in ablation.doc
        for prof in ablation.profiles.values():
            assert prof.fixed["run.ablation"] == name and prof.fixed["run.profile"] == prof.name
            # runs per cell: seeds, times the replicates (transfer: the source runs of a cell) where swept
            per_cell = len(prof.seeds) * min(len(b.get(ablation.replicates, [None])) for b in yamls.named_runs(prof))
            # a CPU demo, a search and a selection stage (held-out data, one source per cell) may run one seed
            one = prof.fixed["trainer.accelerator"] == "cpu" or prof.search or prof.fixed.get("data.holdout")
            assert per_cell >= (1 if one else 3)
        for prof in (ablation.profiles[g] for g in gpu):
            assert prof.fixed["trainer.precision"] == "bf16-mixed"
        if "imagenet" in gpu:
            assert ablation.profiles["imagenet"].fixed["data.name"] == "imagefolder"


def test_yaml_files_are_valid_wandb_sweeps():
    from vit_lightning.commands.sweep.validate import known_keys

    known = known_keys()
    files = sorted((REPO / "sweeps").glob("*.yaml"))
    assert len(files) == len(yamls.expected_files())
    for path in files:
        config = yaml.safe_load(path.read_text())
        searched = config["method"] == "bayes"  # a searched profile (cls_vs_gap demo_bayes)
        assert config["method"] in ("grid", "bayes") and config["program"]
        if searched:
            assert config["run_cap"] >= 1 and hyperband.parse(config["early_terminate"], config["metric"]).bands
        assert config["metric"] == {"name": "val/acc_best", "goal": "maximize"}
        assert config["command"][:4] == ["${env}", "vit-ablate", "fit", "${args}"]
        if "early_terminate" in config:  # the rule travels in the trial's own command (fit's --run.early_terminate)
            flag, _, rule = config["command"][4].partition("=")
            assert flag == "--run.early_terminate" and json.loads(rule)["rule"] == config["early_terminate"]
        else:
            assert len(config["command"]) == 4
        assert "values" in config["parameters"]["seed_everything"]
        for key, spec in config["parameters"].items():
            assert key in known and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", key), key  # W&B's name pattern
            searched_key = searched and spec.get("distribution") == "log_uniform_values" and 0 < spec["min"] < spec["max"]
            assert searched_key or len(spec) == 1 and ("value" in spec or isinstance(spec.get("values"), list)), key


def test_cls_vs_gap_sweeps_a_fine_log_grid_per_setup():
    ablation = load("cls_vs_gap")
    for prof in ablation.profiles.values():
        setups = [(b["model.pooling"], b["model.head"]) for b in prof.grids]
        # appendix D.3's two set-ups and the control that tells the token from the head
        assert setups == [(["cls"], ["mlp_tanh"]), (["gap"], ["linear"]), (["cls"], ["linear"])]
        for block in prof.grids:
            lrs = sorted(block["model.lr"])
            assert len(lrs) >= 7 and all(1 < b / a <= 2 + 1e-9 for a, b in zip(lrs, lrs[1:]))
    demo = ablation.profiles["demo"].grids[0]["model.lr"]
    # both sides of the 30-epoch check's lr (2e-3), with room; below the first grid's lowest (5e-4)
    assert min(demo) < 0.0005 and 0.004 <= max(demo)
    assert len(ablation.profiles["demo"].seeds) >= 5


def test_patch_sizes_divide_the_image():
    sizes = {"demo": 28, "cifar10": 32, "imagenet": 224}
    for name, prof in load("patch_size").profiles.items():
        assert all(sizes[name] % p == 0 for p in prof.grids[0]["model.patch_size"])


# --- W&B semantics -----------------------------------------------------------------------------------
def test_grid_is_the_cartesian_product_in_any_key_order():
    params = {"a": {"values": [1, 2, 3]}, "b": {"values": ["x", "y"]}, "c": {"value": True}}
    trials = expand.expand({"method": "grid", "parameters": params})
    reordered = expand.expand({"method": "grid", "parameters": dict(reversed(list(params.items())))})
    as_set = lambda ts: {tuple(sorted(t.items())) for t in ts}  # noqa: E731
    assert len(trials) == 6 and as_set(trials) == as_set(reordered)
    assert as_set(trials) == {(("a", a), ("b", b), ("c", True)) for a in (1, 2, 3) for b in "xy"}
    assert [list(t) for t in trials] == [["a", "b", "c"]] * 6  # W&B reads parameters in sorted order


def test_grid_dedupes_and_enumerates_int_and_q_uniform():
    params = {"a": {"values": [1, 1.0, 2]}, "n": {"min": 1, "max": 3},
              "q": {"distribution": "q_uniform", "min": 0, "max": 1, "q": 0.25}}
    trials = expand.expand({"method": "grid", "parameters": params})
    assert len(trials) == 2 * 3 * 4  # 1 and 1.0 are one value; int_uniform includes max; q_uniform excludes it
    assert {t["n"] for t in trials} == {1, 2, 3} and {t["q"] for t in trials} == {0, 0.25, 0.5, 0.75}


def test_grid_run_cap_and_count():
    config = {"method": "grid", "parameters": {"a": {"values": list(range(10))}}, "run_cap": 4}
    assert len(expand.expand(config)) == 4
    assert len(expand.expand(config, count=2)) == 2
    with pytest.raises(ValueError, match="not allowed with method grid"):
        expand.expand({"method": "grid", "parameters": {"a": {"min": 0.0, "max": 1.0}}})


def test_random_counts_seed_and_bounds():
    params = {
        "u": {"min": 0.5, "max": 2.0},
        "i": {"min": 1, "max": 4},
        "c": {"values": ["a", "b"]},
        "k": {"value": 7},
        "lv": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1},
        "lu": {"distribution": "log_uniform", "min": -2.0, "max": 1.0},
        "qu": {"distribution": "q_uniform", "min": 0, "max": 10, "q": 2},
        "n": {"distribution": "normal", "mu": 1.0, "sigma": 0.1},
    }
    config = {"method": "random", "parameters": params, "run_cap": 400}
    trials = expand.expand(config, seed=3)
    assert len(trials) == 400 and trials == expand.expand(config, seed=3) != expand.expand(config, seed=4)
    assert len(expand.expand(config, count=5)) == 5
    assert all(0.5 <= t["u"] <= 2.0 and t["k"] == 7 for t in trials)
    assert {t["i"] for t in trials} == {1, 2, 3, 4} and {t["c"] for t in trials} == {"a", "b"}
    assert all(1e-4 <= t["lv"] <= 1e-1 and math.exp(-2) <= t["lu"] <= math.e for t in trials)
    assert all(isinstance(t["qu"], int) and t["qu"] % 2 == 0 and 0 <= t["qu"] <= 10 for t in trials)
    assert abs(statistics.mean(t["n"] for t in trials) - 1.0) < 0.05
    # log-uniform: each decade gets about a third of the draws, so the median is the geometric mean
    logs = [math.log10(t["lv"]) for t in trials]
    assert abs(statistics.median(logs) - (-2.5)) < 0.25
    assert all(abs(sum(lo <= x < lo + 1 for x in logs) / len(logs) - 1 / 3) < 0.1 for lo in (-4, -3, -2))


def test_random_needs_a_bound_and_custom_needs_wandb():
    with pytest.raises(ValueError, match="run_cap"):
        expand.expand({"method": "random", "parameters": {"a": {"values": [1]}}})
    with pytest.raises(ValueError, match="--backend wandb"):
        expand.expand({"method": "custom", "parameters": {"a": {"values": [1]}}})


def test_args_render_like_the_wandb_agent():
    trial = {"a": True, "b": [3, 4], "c": 0.0001, "d": 1e-05, "e": "none", "f": 2}
    assert render_args(trial) == ["--a=True", "--b=[3, 4]", "--c=0.0001", "--d=1e-05", "--e=none", "--f=2"]


# --- validation: one line, before anything runs ------------------------------------------------------
@pytest.mark.parametrize("params, message", [
    ({"model.pos_encodng": {"value": "none"}}, "unknown key 'model.pos_encodng'"),
    ({"model.pos_encoding": {"values": ["none", "fourier"]}},
     "model.pos_encoding=fourier: unknown model.pos_encoding='fourier'; choose from: none, learned_1d"),
    ({"model.pooling": {"value": "max"}}, "cls, gap"),
    ({"data.name": {"value": "svhn"}}, "mnist5k"),
    ({"model.pos_encoding": {"values": ["learned_1d", "relative_1d"]},
      "model.pos_injection": {"values": ["stem", "every_layer"]}},
     "model.pos_encoding=relative_1d with model.pos_injection=every_layer: "),
    ({"model.lr": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2},
      "model.pooling": {"values": ["cls", "gap"]}, "data.batch_size": {"values": [32, 0]}},
     "data.batch_size=0: data.batch_size=0 is out of range: a whole number, finite, in [1, 16777216]"),
    ({"model.lr": {"distribution": "uniform", "min": -1.0, "max": 1.0}}, "model.lr=-1.0 is out of range: a number, finite, in (0, 10]"),
    ({"model.lr": {"distribution": "log_uniform_values", "min": 0.0, "max": 1.0}}, "needs min > 0"),
    ({"model.lr": {"values": []}}, "non-empty"),
    ({"trainer.max_epochs": {"value": "abc"}}, "trainer.max_epochs=abc is not valid"),
])
def test_bad_sweep_files_fail_with_one_line(tmp_path, capsys, params, message):
    code, out, err = run_cli([write_sweep(tmp_path, params), "--backend", "local"], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_malformed_yaml_unknown_sweep_key_and_set(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: grid\nparameters: {a: [1, 2\n")
    code, _, err = run_cli([str(bad)], capsys)
    assert code == 2 and "malformed YAML at line" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli([write_sweep(tmp_path, {"model.lr": {"value": 0.1}}, early_stop=1)], capsys)
    assert code == 2 and "unknown sweep key 'early_stop'" in err
    code, _, err = run_cli(["pos_encoding", "--dry-run", "--set", "trainer.max_epoch=1"], capsys)
    assert code == 2 and "--set trainer.max_epoch: unknown key" in err and "trainer.max_epochs" in err
    code, _, err = run_cli(["pos_encodings", "--dry-run"], capsys)
    assert code == 2 and "ablations: " in err
    code, _, err = run_cli(["pos_encoding", "--profile", "jft", "--dry-run"], capsys)
    assert code == 2 and "choose from demo" in err


# --- dry run -----------------------------------------------------------------------------------------
def parse_line(line: str) -> dict:
    import shlex

    words = shlex.split(line)
    assert words[:2] == ["vit-ablate", "fit"]
    return dict(w[2:].split("=", 1) for w in words[2:])


def dry_run_trials(capsys, *argv) -> list[dict]:
    code, out, _ = run_cli(["pos_encoding", "--dry-run", *argv], capsys)
    assert code == 0
    return [parse_line(x) for x in commands(out)]


def commands(out: str) -> list[str]:
    """A dry run's command lines (its other lines, the count and each trial's state, start with #)."""
    return [line for line in out.strip().splitlines() if not line.startswith("#")]


def test_dry_run_lists_every_table8_cell_and_demo_all_ours_too(capsys, tmp_path, monkeypatch):
    from vit_lightning.model import ENCODINGS

    monkeypatch.chdir(tmp_path)  # no runs: a checkout where the main job has run lists its trials as done

    # the encodings demo_all was committed with: one added later changes no committed profile
    committed = {"none", "learned_1d", "learned_2d", "sincos_2d", "relative_1d", "relative_bias_2d", "rope_axial",
                 "rope_mixed", "learned_1d+rope_axial", "learned_1d+rope_mixed", "alibi_2d", "peg"}

    ablation = load("pos_encoding")
    for profile, want in [("demo", set(ablation.reference)),  # the main job: the cells the paper ran
                          ("demo_all", {(e, i) for e, enc in ENCODINGS.items() for i in enc.injections
                                        if e in committed})]:
        args = dry_run_trials(capsys, "--profile", profile)
        trials = [(a["model.pos_encoding"], a["model.pos_injection"], a["seed_everything"]) for a in args]
        assert len(trials) == len(set(trials)) == len(want) * len(ablation.profiles[profile].seeds)
        assert {trial[:2] for trial in trials} == want
        assert all(a["run.profile"] == profile for a in args)
    assert len(want) == 18 and len(ablation.reference) == 8  # the paper's 8, ours 3, RoPE 4, alibi_2d 1, peg 2
    seeds = {name: set(ablation.profiles[name].seeds) for name in ("demo", "replicate")}
    assert len(seeds["demo"]) == len(seeds["replicate"]) == 7 and not seeds["demo"] & seeds["replicate"]


def test_dry_run_set_overrides_every_trial(capsys):
    code, out, _ = run_cli(["cls_vs_gap", "--profile", "cifar10", "--dry-run", "--set", "trainer.max_epochs=1",
                            "--set", "data.root=/data"], capsys)
    args = [parse_line(x) for x in commands(out)]
    assert code == 0 and len(args) == 3 * 7 * 3  # set-ups x learning rates x seeds
    assert all(a["trainer.max_epochs"] == "1" and a["data.root"] == "/data" for a in args)


def test_set_reads_an_exponent_as_a_number_and_refuses_null_in_one_line(capsys):
    code, out, _ = run_cli(["hybrid", "--dry-run", "--set", "model.lr=1e-3"], capsys)
    assert code == 0 and {parse_line(x)["model.lr"] for x in commands(out)} == {"0.001"}
    code, out, err = run_cli(["hybrid", "--dry-run", "--set", "model.patch_size=null"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "cannot pass null" in lines[0], err


def test_the_local_job_script_gives_each_slot_a_gpu_and_its_loaders_cpus_and_runs_the_same_sweep(capsys):
    code, out, err = run_cli(["hybrid", "--profile", "cifar10", "--backend", "local", "--parallel", "2",
                              "--set", "trainer.max_epochs=3", "--print-sbatch"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert "#SBATCH --gpus-per-node=2" in lines and any(line.startswith("#SBATCH --cpus-per-task=18 ") for line in lines)
    [run] = [line for line in lines if " sweep hybrid " in line]
    assert run.endswith("--backend local --profile cifar10 --parallel 2 --set trainer.max_epochs=3 &"), run
    assert "scontrol requeue" in out and "--signal=B:USR1@120" in out
    # one log per job, an array task's by its own job id (`%a` is 4294967294 without --array); the time limit
    # reaches the sweep as itself (SIGUSR1), so it is logged as the time limit
    assert "#SBATCH --output=%x-%j.out" in lines and """trap 'kill -USR1 "$pid"; requeue=1' USR1""" in lines


# --- W&B backend -------------------------------------------------------------------------------------
def test_gpu_split_is_shared_by_both_backends():
    from vit_lightning.commands.sweep.supervise import slot_envs, split_gpus

    gpus = [str(i) for i in range(8)]
    assert split_gpus(gpus) == [[g] for g in gpus]  # W&B default: one agent per GPU
    assert split_gpus(gpus, per_group=2) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert split_gpus(gpus, groups=1) == [gpus]
    assert split_gpus(gpus, per_group=3) == [["0", "1", "2"], ["3", "4", "5"]]
    assert split_gpus(gpus[:4], groups=2) == [["0", "1"], ["2", "3"]]  # local --parallel 2
    assert split_gpus([], groups=2) == [[], []]
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        split_gpus(gpus[:4], groups=4, per_group=2)
    with pytest.raises(ValueError, match="needs 3 GPUs; 2 visible"):
        split_gpus(gpus[:2], groups=3)
    assert slot_envs([["0", "1"], ["2", "3"]]) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert slot_envs([[]]) == [{}]
    assert slot_envs([[], []], cpus=8) == [{"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}] * 2
    # each agent gets its own slot: its GPUs, or without GPUs half of this machine's CPU threads
    assert [a.env for a in wandb_backend.agent_commands(["p/x"], [["0"], ["1"]])] == [
        {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    half = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert wandb_backend.agent_commands(["p/x"], [[], []])[1].env == {"OMP_NUM_THREADS": half, "MKL_NUM_THREADS": half}


def test_agent_commands_and_env():
    agents = wandb_backend.agent_commands(["me/proj/a1", "me/proj/b2"], [["0", "1"], ["2", "3"]], count=3)
    assert [a.env for a in agents] == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert agents[0].commands == (("wandb", "agent", "--forward-signals", "--count", "3", "me/proj/a1"),
                                  ("wandb", "agent", "--forward-signals", "--count", "3", "me/proj/b2"))
    one = wandb_backend.agent_commands(["p/x"], [["4"]])[0]
    assert one.shell() == "CUDA_VISIBLE_DEVICES=4 wandb agent --forward-signals p/x"


def test_local_bayes_sweep_needs_a_cap(tmp_path, capsys):
    path = write_sweep(tmp_path, {"model.lr": {"min": 0.0001, "max": 0.01}}, method="bayes")
    code, _, err = run_cli([path, "--backend", "local"], capsys)
    assert code == 2 and "give run_cap in the sweep or --count N" in err and len(err.splitlines()) == 1


def test_run_agents_pins_each_agent_and_staggers_starts(tmp_path):
    out = tmp_path / "agents.txt"
    script = f'echo "$CUDA_VISIBLE_DEVICES $(date +%s.%N)" >> {out}'
    groups = [["0", "1"], ["2", "3"]]
    agents = [wandb_backend.Agent((("sh", "-c", script), ("sh", "-c", script)), {"CUDA_VISIBLE_DEVICES": ",".join(g)})
              for g in groups]
    assert wandb_backend.run_agents(agents, stagger_s=0.5, log=lambda msg: None) == 0
    rows = [line.split() for line in out.read_text().splitlines()]
    assert sorted(r[0] for r in rows) == ["0,1", "0,1", "2,3", "2,3"]  # each agent runs every sweep, on its GPUs
    first = {g: min(float(t) for d, t in rows if d == g) for g in ("0,1", "2,3")}
    assert first["2,3"] - first["0,1"] >= 0.4


# --- one trial identity: the runner, fit and the tables read values alike ------------------------------
def test_normalize_reads_values_as_fit_parses_them():
    from vit_lightning.core.identity import normalize, same

    assert normalize("1e-4") == normalize(0.0001) == 0.0001 and normalize("1.5E3") == 1500
    assert normalize("2") == normalize(2.0) == 2 and normalize("-3") == -3
    assert normalize("true") is True and normalize("False") is False and normalize(True) is True
    assert normalize(("1", 2.5)) == [1, 2.5] and normalize({"a": "3"}) == {"a": 3}
    assert normalize("none") == "none" and normalize("learned_1d") == "learned_1d" and normalize(None) is None
    assert same([1, 1], (1.0, "1")) and not same(0.001, 0.0001) and not same("cls", "gap")


def test_runner_and_tables_agree_on_a_value_spelled_two_ways(tmp_path):
    from vit_lightning.commands.sweep.trials import build
    from vit_lightning.model.family import trial_name
    from vit_lightning.records.frame import cell_index

    def sweep(lr):
        params = {"model.lr": {"value": lr}, "seed_everything": {"value": 0}, "run.root": {"value": str(tmp_path)}}
        return {"method": "grid", "command": yamls.COMMAND, "parameters": params}

    text, number = build([sweep("1e-4")])[0], build([sweep(0.0001)])[0]  # YAML reads 1e-4 as a string
    assert text.id == number.id == trial_name({"model.lr": 0.0001, "seed_everything": 0}) and text.run_dir == number.run_dir
    assert f"--run.trial={text.id}" in text.command
    # a record fit wrote (lr parsed as the float) belongs to the designed cell either way
    assert cell_index([{"model.lr": "1e-4"}], {"model.lr": 0.0001}) == 0
    assert cell_index([{"model.lr": 0.001}], {"model.lr": 0.0001}) == -1
    assert len(build([sweep("1e-4"), sweep(0.0001)])) == 1  # one run, not two


def test_a_trial_finds_its_record_by_id(tmp_path):
    import json

    from vit_lightning.commands.sweep.trials import build, find_record

    params = {"model.lr": {"values": [0.1, 0.2]}, "run.root": {"value": str(tmp_path)},
              "run.ablation": {"value": "a"}, "run.profile": {"value": "p"}}
    first, second = build([{"method": "grid", "command": yamls.COMMAND, "parameters": params}])
    assert first.id != second.id and first.run_dir == tmp_path / "a" / "p" / first.id

    def write(directory, **record):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "results.json").write_text(json.dumps({"status": "completed", **record}))

    assert find_record(first) is None
    write(tmp_path / "a" / "p" / "other", trial="other", config={"model.lr": 0.1})  # same values, another run
    assert find_record(first) is None
    write(first.run_dir, trial=second.id)  # a record that says it is another trial's
    assert find_record(first) is None
    write(first.run_dir, trial=first.id)
    assert find_record(first)["status"] == "completed" and find_record(second) is None


def test_fit_names_its_run_dir_with_the_trial_id(tmp_path):
    from vit_lightning.core.identity import run_dir
    from vit_lightning.model.family import trial_name

    config = {"run.root": str(tmp_path), "run.ablation": "a", "run.profile": "p", "model.lr": 0.1}
    with pytest.raises(ValueError, match="run.trial is not set"):
        run_dir(config)
    assert run_dir({**config, "run.trial": "t-1"}) == tmp_path / "a" / "p" / "t-1"
    assert trial_name(config) == trial_name({**config, "run.profile": "q", "trainer.enable_progress_bar": False})
    assert trial_name(config) != trial_name({**config, "model.lr": 0.2})
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="run.trial"):
            run_dir({**config, "run.trial": bad})


def test_a_sweep_may_not_set_the_trial_id(tmp_path, capsys):
    code, _, err = run_cli([write_sweep(tmp_path, {"run.trial": {"value": "x"}}), "--dry-run"], capsys)
    assert code == 2 and "run.trial is handed to each trial by the sweep runner" in err


# --- every trial is checked before any starts --------------------------------------------------------
def test_a_patch_size_that_does_not_divide_the_image_is_rejected_up_front(tmp_path, capsys):
    from vit_lightning.commands.sweep import local

    runs = tmp_path / "runs"
    params = {"model.patch_size": {"values": [7, 5]}, "data.name": {"value": "mnist5k"},
              "run.root": {"value": str(runs)}}
    code, out, err = run_cli([write_sweep(tmp_path, params), "--backend", "local"], capsys)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "model.patch_size=5" in err and "not divisible by patch_size=5" in err
    assert "1, 2, 4, 7, 14, 28" in err  # the valid choices for 28-pixel digits
    assert not runs.exists()
    # the linked size follows the data: 8 divides CIFAR's 32 px and data.img_size=40, not 28
    good = {"model.patch_size": {"value": 8}, "data.name": {"value": "cifar10"}, "run.root": {"value": str(runs)}}
    assert run_cli([write_sweep(tmp_path, good), "--dry-run"], capsys)[0] == 0
    sized = {**good, "data.name": {"value": "imagefolder"}, "data.img_size": {"values": [40, 28]}}
    code, _, err = run_cli([write_sweep(tmp_path, sized), "--dry-run"], capsys)
    assert code == 2 and "data.img_size=28" in err and "image size 28 is not divisible by patch_size=8" in err
    assert not runs.exists() and not list(tmp_path.glob(f"**/{local.STATE}"))


# --- ablations come from the package -----------------------------------------------------------------
def test_ablations_load_independent_of_the_working_directory(tmp_path, monkeypatch):
    import subprocess
    import sys

    local_dir = tmp_path / "ablations"  # a folder that shadowed the packaged ones when loaded from the cwd
    local_dir.mkdir()
    (local_dir / "pos_encoding.py").write_text("raise SystemExit('code from the working directory ran')\n")
    (local_dir / "mine.py").write_text("raise SystemExit('code from the working directory ran')\n")
    script = ("from vit_lightning.ablation import available, load; "
              "print(' '.join(available()), load('pos_encoding').name)")
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted(p.stem for p in (REPO / "ablations").glob("[!_]*.py")) + ["pos_encoding"]


def test_ablations_dir_adds_user_ablations(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    source = (REPO / "ablations" / "hybrid.py").read_text().replace('name="hybrid"', 'name="my_stems"')
    (mine / "my_stems.py").write_text(source)
    code, out, _ = run_cli(["my_stems", "--ablations-dir", str(mine), "--dry-run"], capsys)
    trials = len(load("hybrid").profiles["demo"].trials())
    assert code == 0 and len(commands(out)) == trials and "--run.ablation=my_stems" in out
    assert run_cli(["my_stems", "--dry-run"], capsys)[0] == 2  # only when asked for
    (mine / "hybrid.py").write_text(source)
    code, _, err = run_cli(["my_stems", "--ablations-dir", str(mine), "--dry-run"], capsys)
    assert code == 2 and "hybrid.py: a packaged ablation has this name" in err


def test_every_package_is_installed():
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "vit_lightning").rglob("__init__.py")}
    assert set(setup["packages"]) == found | {"vit_lightning.ablations"}
    assert setup["package-dir"] == {"vit_lightning.ablations": "ablations"}


def test_a_set_that_changes_only_the_record_keeps_trial_names_and_says_so(tmp_path, capsys):
    """run.fewshot_every is not part of a trial's name: the note says finished trials are not trained again."""
    sweep = write_sweep(tmp_path, {"model.lr": {"values": [0.001, 0.002]}})
    code, plain, _ = run_cli([sweep, "--dry-run"], capsys)
    code_set, with_set, err = run_cli([sweep, "--dry-run", "--set", "run.fewshot_every=2"], capsys)
    assert code == code_set == 0
    names = [line.split("--run.trial=")[1] for line in plain.splitlines() if "--run.trial=" in line]
    assert names and names == [line.split("--run.trial=")[1] for line in with_set.splitlines() if "--run.trial=" in line]
    assert "--set run.fewshot_every changes what a trial records" in err and "run.retrain=true" in err
    _, _, err = run_cli([sweep, "--dry-run", "--set", "trainer.max_epochs=2"], capsys)
    assert "changes what a trial records" not in err
