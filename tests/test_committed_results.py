"""The committed results/ regenerate byte for byte from the committed run records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vit_lightning.commands.results.cli import main as table_main

RESULTS = Path(__file__).resolve().parent.parent / "results"
ABLATIONS = sorted(p.parent.name for p in RESULTS.glob("*/records"))
TEXT_FILES = ("table.md", "table.tex", "runs.csv")
# Tables in another metric, committed beside the ablation's own: (ablation, subfolder, metric)
OTHER_METRICS = [("pos_encoding", "fewshot5", "val/fewshot5"), ("cls_vs_gap", "fewshot5", "val/fewshot5")]


def table_pngs(folder: Path) -> list[str]:
    """The table's plots; the analysis figures (each with its numbers in a .csv beside it) need checkpoints."""
    return sorted(p.name for p in folder.glob("*.png") if not p.with_suffix(".csv").exists())


def test_every_ablation_has_committed_results():
    assert set(ABLATIONS) == {"pos_encoding", "cls_vs_gap", "patch_size", "hybrid", "swin", "transfer", "registers",
                              "pos_diagnostic"}


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_table_regenerates_the_committed_files(ablation, tmp_path):
    committed = RESULTS / ablation
    out = tmp_path / ablation
    shutil.copytree(committed / "records", out / "records")
    assert table_main([ablation, "--runs", str(tmp_path / "no-runs"), "--out", str(out)]) == 0
    for name in TEXT_FILES:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{ablation}/{name} differs"
    assert table_pngs(committed) == table_pngs(out)  # the same plots (pixels depend on matplotlib)


@pytest.mark.parametrize("ablation, folder, metric", OTHER_METRICS)
def test_table_in_another_metric_regenerates(ablation, folder, metric, tmp_path):
    committed = RESULTS / ablation / folder
    out = tmp_path / folder
    shutil.copytree(RESULTS / ablation / "records", out / "records")
    argv = [ablation, "--runs", str(tmp_path / "no-runs"), "--out", str(out), "--metric", metric, "--no-figures"]
    assert table_main(argv) == 0
    for name in TEXT_FILES:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{ablation}/{folder}/{name} differs"


# Second draws of a demo (other seeds), each tabulated beside the first, and searched profiles, each measured against
# the demo grid: (ablation, subfolder, profile)
REPLICATES = [("pos_encoding", "replicate", "replicate"), ("cls_vs_gap", "demo_bayes", "demo_bayes"),
              ("cls_vs_gap", "demo_bayes_seeds", "demo_bayes_seeds")]


@pytest.mark.parametrize("ablation, folder, profile", REPLICATES)
def test_second_draw_regenerates_beside_the_first(ablation, folder, profile, tmp_path, monkeypatch):
    committed = RESULTS / ablation / folder
    first, out = tmp_path / "results" / ablation, tmp_path / "results" / ablation / folder
    shutil.copytree(RESULTS / ablation / "records", first / "records")
    shutil.copytree(committed / "records", out / "records")
    monkeypatch.chdir(tmp_path)  # the table names the first draw as given: results/ABLATION
    argv = [ablation, "--profile", profile, "--runs", "no-runs", "--out", str(out), "--no-figures",
            "--compare-with", f"results/{ablation}"]
    assert table_main(argv) == 0
    for name in TEXT_FILES:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{ablation}/{folder}/{name} differs"


# Further profiles committed in a subfolder of their ablation, each tabulated on its own: (ablation, profile)
PROFILES = [("pos_encoding", "relative_scale"), ("pos_encoding", "modern"), ("pos_encoding", "peg_padding"),
            ("transfer", "modern")]


@pytest.mark.parametrize("ablation, profile", PROFILES)
def test_another_profile_regenerates(ablation, profile, tmp_path):
    committed = RESULTS / ablation / profile
    out = tmp_path / profile
    shutil.copytree(committed / "records", out / "records")
    argv = [ablation, "--profile", profile, "--runs", str(tmp_path / "no-runs"), "--out", str(out), "--no-figures"]
    assert table_main(argv) == 0
    for name in TEXT_FILES:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{ablation}/{profile}/{name} differs"
