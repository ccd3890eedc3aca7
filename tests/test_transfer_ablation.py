"""The transfer ablation: trials name their source runs, a sweep waits for them in one line, and the table."""

from __future__ import annotations

import json
import statistics

import pytest

from vit_lightning.ablation import load
from vit_lightning.results import cli as table_cli
from vit_lightning.sweep import cli, trials, yamls

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
from vit_lightning.ablations.transfer import ABLATION as PAPER, FINE_TUNE, transfer_profile
SOURCE = load("src", Path(__file__).parent)
FIXED = {**FINE_TUNE, **%(fixed)r, "data.img_size": 56}
ABLATION = dataclasses.replace(PAPER, name="dst", profiles={"demo": transfer_profile(SOURCE, "demo", FIXED, "tiny")})
'''


def test_trials_name_the_source_sweeps_runs_by_trial_id():
    ablation, source = load("transfer"), load("pos_encoding")
    for name in ablation.profiles:
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
    assert header[2:6] == ["source (its resolution)", "new resolution, not fine-tuned", "shuffle drop", "accuracy"]
    row = next(r for r in rows if r[:2] == ["learned_2d", "stem"])
    assert row[2:6] == [cell("transfer/source_acc"), cell("transfer/start_acc"), cell("val/shuffle_drop"),
                        cell("val/acc_best")]
