"""The transfer ablation: trials name their source runs, a sweep waits for them in one line, and the table."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import yaml
from vit_lightning.ablations.transfer import DEMO, transfer_profiles

from vit_lightning.ablation import load
from vit_lightning.commands.results import cli as table_cli
from vit_lightning.commands.sweep import cli, trials, yamls

TINY = {"data.name": "mnist5k", "data.batch_size": 16, "model.variant": "micro", "model.patch_size": 7,
        "trainer.max_epochs": 1, "trainer.limit_train_batches": 3, "trainer.limit_val_batches": 2,
        "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.enable_model_summary": False,
        "trainer.enable_progress_bar": False, "run.wandb": "off"}
SOURCE_FILE = '''"""A tiny source ablation. Run: vit-ablate sweep src"""
from vit_lightning.ablation import METRIC, Ablation, profile
GRID = {"model.pos_encoding": ["learned_2d"], "model.pos_injection": ["stem"]}
ABLATION = Ablation(name="src", title="t", source="s", finding="f", metric=METRIC, rows="model.pos_encoding",
                    cols="model.pos_injection", reference={}, reference_note="",
                    profiles={"demo": profile("demo", GRID, fixed=%(fixed)r, seeds=(0, 1))})
'''
TRANSFER_FILE = '''"""The transfer ablation on the tiny source. Run: vit-ablate sweep dst"""
import dataclasses
from pathlib import Path
from vit_lightning.ablation import load
from vit_lightning.ablations.transfer import DEMO, transfer_profiles
from vit_lightning.ablations.transfer import ABLATION as PAPER, FINE_TUNE, transfer_profile
SOURCE = load("src", Path(__file__).parent)
FIXED = {**FINE_TUNE, **%(fixed)r, "data.img_size": 56}
ABLATION = dataclasses.replace(PAPER, name="dst", profiles={"demo": transfer_profile(SOURCE, "demo", FIXED, "tiny")})
'''


def test_trials_name_the_source_sweeps_runs_by_trial_id():
    ablation, source = load("transfer"), load("pos_encoding")
    for name in [n for n in ablation.profiles if n in source.profiles]:  # the fine-tuning stages
        want = {str(t.run_dir) for t in trials.build([c for _, c in yamls.sweep_configs(source, name)])}
        tuned = [t.params for t in trials.build([c for _, c in yamls.sweep_configs(ablation, name)])]
        have = [t["model.init_from"] for t in tuned]
        assert sorted(have) == sorted(want)  # every source run once, under runs/pos_encoding/<profile>/<its id>
        for trial in tuned:  # each transfer trial keeps its source's cell
            cell = f"-{trial['model.pos_encoding']}-{trial['model.pos_injection']}-".replace("+", "_")  # names: no '+'
            assert cell in trial["model.init_from"]
        assert len(ablation.table_profile(name).cells()) == len(source.cells(name))
    demo = ablation.profile("demo").fixed
    assert demo["data.img_size"] == 56 and demo["model.patch_size"] == 7  # 4x4 -> 8x8 patches
    paper = ablation.profile("imagenet").fixed  # Table 4's recipe
    assert (paper["model.optimizer"], paper["model.momentum"], paper["model.weight_decay"],
            paper["trainer.gradient_clip_val"], paper["model.schedule"]) == ("sgd", 0.9, 0.0, 1.0, "cosine")


@pytest.mark.slow
def test_missing_sources_one_line_then_sources_transfer_and_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fixed = {**TINY, "run.root": str(tmp_path / "runs")}
    folder = tmp_path / "ablations"
    folder.mkdir()
    (folder / "src.py").write_text(SOURCE_FILE % {"fixed": fixed})
    (folder / "dst.py").write_text(TRANSFER_FILE % {"fixed": fixed})
    dirs = ["--ablations-dir", str(folder), "--backend", "local"]

    assert cli.main(["dst", *dirs]) == 2
    err = capsys.readouterr().err.strip()
    ids = sorted(t.id for t in trials.build([c for _, c in yamls.sweep_configs(load("src", folder), "demo")]))
    assert len(err.splitlines()) == 1 and all(i in err for i in ids) and len(ids) == 2
    assert err.endswith(f"make them first: vit-ablate sweep src --profile demo --ablations-dir {folder}")
    assert not (tmp_path / "runs").exists()  # nothing written before the sources exist

    assert cli.main(["src", *dirs, "--parallel", "2"]) == 0
    assert cli.main(["dst", *dirs, "--parallel", "2"]) == 0
    out = tmp_path / "results"
    assert table_cli.main(["dst", "--ablations-dir", str(folder), "--runs", str(tmp_path / "runs"),
                           "--out", str(out), "--no-figures"]) == 0

    def records(name: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / name / "demo").glob("*/results.json"))]

    tuned = records("dst")
    sources = {str(tmp_path / "runs" / "src" / "demo" / r["name"]): r for r in records("src")}
    assert len(tuned) == 2 and {r["config"]["model.init_from"] for r in tuned} == set(sources)
    for r in tuned:  # the source's accuracy is the source record's own
        assert r["metrics"]["transfer/source_acc"] == sources[r["config"]["model.init_from"]]["metrics"]["val/acc_best"]

    def cell(key: str) -> str:
        values = [r["metrics"][key] for r in tuned]
        return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} (n=2)"

    rows = [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in (out / "table.md").read_text().splitlines()]
    header = next(r for r in rows if r[:2] == ["pos_encoding", "pos_injection"])
    assert header[2:6] == ["source (its resolution)", "new resolution (both: resized), not fine-tuned", "shuffle drop", "accuracy"]
    row = next(r for r in rows if r[:2] == ["learned_2d", "stem"])
    assert row[2:6] == [cell("transfer/source_acc"), cell("transfer/start_acc"), cell("val/shuffle_drop"),
                        cell("val/acc_best")]


def selection_trials(root) -> list:
    """The transfer demo's lr-selection trials with their runs under root."""
    configs = [c for _, c in yamls.sweep_configs(load("transfer"), "demo_select")]
    for config in configs:
        config["parameters"]["run.root"] = {"value": str(root)}
    return trials.build(configs)


def test_the_lr_is_selected_per_cell_on_held_out_data_and_the_sweep_waits_for_it(tmp_path, capsys):
    ablation = load("transfer")
    select = ablation.profile("demo_select")
    assert select.fixed["data.holdout"] > 0 and "model.lr" not in select.fixed  # validated on held-out digits
    chosen = selection_trials(tmp_path)
    # the paper's four and, since every demo cell chose the largest of them, three more above
    assert len(chosen) == 8 * 7 and {t.params["model.lr"] for t in chosen} == {0.003, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4}
    assert all("-s0-" in t.params["model.init_from"] for t in chosen)  # one source per cell: seed 0's
    argv = ["transfer", "--dry-run", "--set", f"run.root={tmp_path}"]

    assert cli.main(argv) == 2  # nothing selected yet: one line naming the command
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("make them first: vit-ablate sweep transfer --profile demo_select") and "56 run(s)" in err

    best = {"none": 0.06, "learned_1d": 0.03}  # each cell's best lr on the held-out digits (others: 0.01)
    for trial in chosen:
        top = best.get(trial.params["model.pos_encoding"], 0.01)
        acc = 0.9 - abs(math.log10(trial.params["model.lr"] / top))
        trial.run_dir.mkdir(parents=True)
        (trial.run_dir / "results.json").write_text(json.dumps(
            {"name": trial.id, "trial": trial.id, "status": "completed", "metrics": {"val/acc_best": acc}}))
    assert cli.main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]  # the commands
    assert len(lines) == 56  # every source of every cell, at its cell's lr
    for line in lines:
        encoding = line.split("--model.pos_encoding=")[1].split()[0]
        assert f"--model.lr={best.get(encoding, 0.01)} " in line and "--data.holdout" not in line


def test_the_stages_are_one_line_for_another_source_profile():
    source = load("pos_encoding")
    stages = transfer_profiles(source, "demo_all", DEMO, "every encoding", base="demo")
    assert list(stages) == ["demo_all_select", "demo_all", "demo_all_scratch"]
    assert stages["demo_all"].fixed["model.lr"] == "select:demo_all_select"
    scratch = stages["demo_all_scratch"]  # the control: the source's recipe at the new resolution, same steps
    assert scratch.seeds == source.profile("demo_all").seeds and scratch.cells() == source.cells("demo_all")
    assert {k: scratch.fixed[k] for k in ("data.img_size", "trainer.max_epochs", "data.batch_size")} == \
        {"data.img_size": 56, "trainer.max_epochs": 3, "data.batch_size": 32}
    kept = {k: v for k, v in source.profile("demo_all").fixed.items() if not k.startswith("run.")}
    assert {k: scratch.fixed[k] for k in kept if k not in ("data.img_size", "trainer.max_epochs", "data.batch_size")} \
        == {k: v for k, v in kept.items() if k not in ("data.img_size", "trainer.max_epochs", "data.batch_size")}


def test_a_select_value_naming_no_stage_is_one_line(tmp_path, capsys):
    stem, config = yamls.sweep_configs(load("transfer"), "demo")[0]
    config["parameters"]["model.lr"] = {"value": "select:demo_nope"}
    path = tmp_path / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("vit-ablate sweep: error: model.lr=select:demo_nope: ablation 'transfer' has no profile")
    assert "demo_select" in err


def test_the_modern_runs_transfer_too_beside_rope_vits_numbers():
    ablation, source = load("transfer"), load("pos_encoding")
    assert {"modern_select", "modern", "modern_scratch"} <= set(ablation.profiles)
    modern = ablation.profile("modern")
    assert [c["model.pos_encoding"] for c in modern.cells()] == [c["model.pos_encoding"] for c in source.cells("modern")]
    assert modern.reference["rope_mixed"] == "80.9 -> 81.8" and "without fine-tuning" in modern.reference_note
    assert ablation.profile("modern_scratch").reference is None  # the control shows no one's numbers
