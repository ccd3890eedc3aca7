"""Attention read-outs: per block entropy and distance (in tokens) against uniform attention worked out by hand, and
`vit-ablate eval` filing them with the grid rules in the run record, on canvases up to 28 tokens per side."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vit_lightning import ViT
from vit_lightning.analysis.attention import readouts
from vit_lightning.analysis.evaluate import add_eval
from vit_lightning.core.evalkey import parse


def test_uniform_attention_has_entropy_log_t_and_the_mean_pairwise_distance():
    model = ViT("micro", img_size=18, in_chans=1, num_classes=4, patch_size=6, pos_encoding="none")  # 3x3 tokens
    for block in model.blocks:  # zero queries and keys: every query attends to every token alike
        block.attn.qkv.weight.data[:128] = 0
        block.attn.qkv.bias.data[:128] = 0
    loader = [(torch.randn(5, 1, 18, 18), torch.zeros(5, dtype=torch.long))] * 3
    got = readouts(model, loader, 12, (3, 3), chunk=4)
    # 3x3 grid: pairwise distances 0 (9), 1 (24), sqrt 2 (16), 2 (12), sqrt 5 (16), sqrt 8 (4) over 81 ordered pairs
    mean_distance = (24 + 16 * math.sqrt(2) + 24 + 16 * math.sqrt(5) + 4 * math.sqrt(8)) / 81
    assert got["attn/images"] == 12
    for i in range(4):
        assert got[f"attn/entropy/block{i}"] == pytest.approx(math.log(10))  # 1 + 9 tokens
        assert got[f"attn/distance/block{i}"] == pytest.approx(mean_distance)
    assert got["attn/entropy"] == pytest.approx(math.log(10)) and got["attn/distance"] == pytest.approx(mean_distance)


def test_the_read_outs_and_the_grid_rules_are_filed_under_their_own_key():
    record = {"source": {}, "data": {"name": "glyphs"}, "img_size": 48, "view": "canvas", "pos_resample": "keep",
              "rope_scaling": "ntk", "key": "glyphs:relative:x1@48px/canvas/keep/rope-ntk", "metrics": {"val/acc": 0.5},
              "attention": {"attn/entropy": 1.5}}
    run_record: dict = {}
    add_eval(record)(run_record)
    add_eval({**record, "pos_resample": "bicubic", "rope_scaling": "none", "key": "glyphs:relative:x1@48px/canvas",
              "attention": {}})(run_record)
    assert run_record["eval"] == {"glyphs:relative:x1@48px/canvas/keep/rope-ntk": {"val/acc": 0.5, "attn/entropy": 1.5},
                                  "glyphs:relative:x1@48px/canvas": {"val/acc": 0.5}}
    keyed = parse("glyphs:relative:x1@48px/tokens/keep/rope-ntk")  # the key reads back, rules and all
    assert (keyed.view, keyed.task, keyed.rules) == ("tokens", "relative", "/keep/rope-ntk")
    assert str(keyed) == "glyphs:relative:x1@48px/tokens/keep/rope-ntk"
    assert parse("glyphs:relative:x1@48px/canvas/keep/rope-ntk") == keyed  # `canvas`, before the views were named


@pytest.mark.slow
def test_eval_reads_out_attention_at_28_tokens_per_side_with_a_frequency_rule(tmp_path):
    from tiny import TINY_MODEL

    from vit_lightning import cli

    fit = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
           "--run.wandb=off", "--run.fewshot_shots=[]", "--data.name=glyphs", "--data.task=relative",
           "--data.img_size=36", "--model.patch_size=6", "--model.pos_encoding=rope_axial", f"--run.root={tmp_path}",
           "--run.trial=g"]
    assert cli.main(["fit", *fit]) == 0
    run = tmp_path / "adhoc" / "local" / "g"
    for extra in ([], ["--rope-scaling", "yarn"]):
        assert cli.main(["eval", str(run), "--data.img_size=168", "--shots", "--shuffle-perms", "0",
                         "--attention-images", "4", "--into-record", *extra]) == 0
    record = json.loads((run / "results.json").read_text())
    assert set(record["eval"]) == {"glyphs:relative:x1@168px/tokens", "glyphs:relative:x1@168px/tokens/rope-yarn"}
    entry = record["eval"]["glyphs:relative:x1@168px/tokens/rope-yarn"]
    assert entry["attn/images"] == 4 and 0 < entry["attn/entropy/block0"] <= math.log(785)
    assert 0 < entry["attn/distance/block0"] < 27 * math.sqrt(2)
    written = json.loads((run / "eval-glyphs-relative-x1-168px-tokens-rope-yarn.json").read_text())
    assert written["rope_scaling"] == "yarn" and written["attention"]["attn/entropy"] == entry["attn/entropy"]
    with pytest.raises(SystemExit):  # argparse refuses a rule it does not know, naming the choices
        cli.main(["eval", str(run), "--data.img_size=48", "--shots", "--rope-scaling", "ntk2"])
