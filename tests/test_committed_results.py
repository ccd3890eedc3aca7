"""The committed results/ regenerate byte for byte from the committed run records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vit_lightning.results.cli import main as table_main

RESULTS = Path(__file__).resolve().parent.parent / "results"
ABLATIONS = sorted(p.parent.name for p in RESULTS.glob("*/records"))
TEXT_FILES = ("table.md", "table.tex", "runs.csv")


def test_every_ablation_has_committed_results():
    assert set(ABLATIONS) == {"pos_encoding", "cls_vs_gap", "patch_size", "hybrid"}


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_table_regenerates_the_committed_files(ablation, tmp_path):
    committed = RESULTS / ablation
    out = tmp_path / ablation
    shutil.copytree(committed / "records", out / "records")
    assert table_main([ablation, "--runs", str(tmp_path / "no-runs"), "--out", str(out)]) == 0
    for name in TEXT_FILES:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), f"{ablation}/{name} differs"
    pngs = sorted(p.name for p in committed.glob("*.png"))
    assert pngs == sorted(p.name for p in out.glob("*.png"))  # the same figures (pixels depend on matplotlib)
