"""`vit-ablate bench` runs end to end and reports every candidate against the baseline."""

from vit_lightning.cli import main
from vit_lightning.model import ENCODINGS


def test_bench_prints_a_ratio_per_candidate(capsys):
    args = ["bench", "--variant", "micro", "--img-size", "16", "--patch-size", "4", "--batch-size", "2",
            "--steps", "1", "--rounds", "1", "--encodings"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("ours", "timm"))]
    assert len(rows) == len(ENCODINGS) + 2  # every encoding, gap pooling, and timm
    assert "timm VisionTransformer" in out and "relative_bias_2d" in out
