"""The registers ablation: viz's artifact numbers against hand computations, into the record, and into a table
that says when no run shows a high-norm token."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from test_results import make, md_cells, table, write_run
from tiny import TINY_MODEL

from vit_lightning import ablation as ablations
from vit_lightning import cli
from vit_lightning.commands.fit import main as train
from vit_lightning.commands.viz import analysis

REG = "model.reg_tokens"


def test_a_token_ten_times_the_median_norm_is_high_and_uniform_attention_has_log_t_entropy():
    tokens = torch.ones(2, 3 + 16, 8)  # [class], two registers, 16 patches
    tokens[0, 3 + 5] *= 10  # one patch token of image 0: ten times the others' norm
    tokens[1, 1] *= 50  # a register: not a patch token, not counted
    assert analysis.high_norm_counts([tokens, torch.ones(2, 19, 8)], 3).tolist() == [1.0, 0.0]
    uniform = torch.full((2, 4, 19, 19), 1 / 19)
    onehot = torch.zeros(2, 4, 19, 19)
    onehot[..., 0] = 1.0  # every query on the [class] token
    got = analysis.attention_entropy_sum([uniform, onehot], 3) / (2 * 16)
    torch.testing.assert_close(got, torch.tensor([math.log(19), 0.0], dtype=torch.float64))


def _registers_like(seeds=(0, 1)):
    real = ablations.load("registers")
    small = make("registers", REG, None, [{REG: [0, 1, 4]}], seeds=seeds)
    return dataclasses.replace(small, columns=real.columns), real


def _write(tmp_path, ab, high: float | None):
    for seed in (0, 1):
        for count, acc in [(0, 0.80), (1, 0.81), (4, 0.805)]:
            name = write_run(tmp_path / "runs", ab, {REG: count}, seed, acc + 0.01 * seed)
            if high is not None:
                path = tmp_path / "runs" / ab.name / "demo" / name / "results.json"
                record = json.loads(path.read_text())
                record["metrics"].update({k: (high if count == 0 and k.endswith("q4") else 0.0) if "high" in k else 2.5
                                          for k in ab.columns})
                path.write_text(json.dumps(record))


def test_the_table_shows_the_artifact_numbers_and_says_when_there_are_none(tmp_path):
    ab, real = _registers_like()
    assert real.rows == REG and [c[REG] for c in real.cells("demo")] == [0, 1, 4]
    _write(tmp_path, ab, 0.0)
    _, md = table(ab, tmp_path)
    header = md_cells(md, "reg_tokens")
    assert "high-norm tokens, layer L/4" in header and "attention entropy (nats), layer L" in header
    assert "no run shows a single high-norm patch token in any layer measured" in md

    other = tmp_path / "second"
    _write(other, ab, 0.125)
    _, md = table(ab, other)
    assert "high-norm patch tokens appear: up to 12.5% of them (reg_tokens=0, high-norm tokens, layer L)" in md

    third = tmp_path / "third"
    _write(third, ab, None)
    _, md = table(ab, third)
    assert "high-norm tokens: not measured (run `vit-ablate viz RUN --into-record`" in md


@pytest.mark.slow
def test_viz_into_record_on_a_run_with_registers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
            "--run.fewshot_shots=[]", "--model.reg_tokens=2", "--model.depth=3", "--run.trial=reg", "--run.wandb=off"]
    assert train.main(argv) == 0
    run = tmp_path / "runs/adhoc/local/reg"
    assert cli.main(["viz", str(run), "--images", "8", "--into-record", "--wandb", "off"]) == 0
    record = json.loads((run / "results.json").read_text())
    assert record["viz"]["images"] == 8 and len(record["viz"]["high_norm"]) == 3
    metrics = record["metrics"]
    # quarters of 3 layers: ceil(3/4) = 1, ceil(6/4) = 2, ceil(9/4) = 3, 3
    assert metrics["viz/high_norm_q4"] == record["viz"]["high_norm"][2] == metrics["viz/high_norm_q3"]
    assert metrics["viz/attn_entropy_q2"] == record["viz"]["attn_entropy"][1]
    assert all(0 <= v <= math.log(1 + 2 + 16) for v in record["viz"]["attn_entropy"])  # 19 tokens at most
    assert all(0 <= v <= 1 for v in record["viz"]["high_norm"])
    assert (run / "viz" / "artifacts.csv").read_text().count("\n") == 1 + 3
