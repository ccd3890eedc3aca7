"""2-D ALiBi and CPVT's PEG: ALiBi's bias against a loop by hand, PEG against timm's PosConv and a hand-computed
convolution; both work at any grid with nothing to resample, say so in the record, and refuse what cannot apply."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_model import naive_attention
from tiny import TINY_MODEL

from vit_lightning import ViT, cli
from vit_lightning.commands.fit import main as train
from vit_lightning.model.position import Peg, alibi_slopes
from vit_lightning.run.transfer import Source, account, start_from

MICRO = dict(in_chans=1, num_classes=10, patch_size=4)


def test_alibi_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -k for k in (2, 4, 6, 8)]))
    # 6 heads: the 4-head sequence, then the 1st and 3rd slopes of the 8-head one
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -k for k in (2, 4, 6, 8, 1, 3)]))


@pytest.mark.parametrize("pooling,registers", [("cls", 0), ("gap", 0), ("cls", 2)])
def test_alibi_bias_equals_a_loop_over_patch_pairs(pooling, registers):
    torch.manual_seed(0)
    model = ViT("micro", img_size=(8, 12), **MICRO, pos_encoding="alibi_2d", pooling=pooling,
                reg_tokens=registers).double()
    alibi, attn = model.pos.parts[2], model.blocks[2].attn
    p, (gh, gw) = model.num_prefix, (2, 3)
    assert alibi.grid == (gh, gw) and alibi.num_prefix == p

    def bias(b, h, i, j, q):
        if i < p or j < p:  # prefix tokens have no place on the grid: no bias to or from them
            return 0.0
        (ri, ci), (rj, cj) = divmod(i - p, gw), divmod(j - p, gw)
        return -(2.0 ** (-8 * (h + 1) / 4)) * math.sqrt((ri - rj) ** 2 + (ci - cj) ** 2)

    x = torch.randn(2, p + gh * gw, 64, dtype=torch.float64)
    torch.testing.assert_close(attn(x, alibi), naive_attention(x, attn, bias))


def test_alibi_learns_and_saves_nothing_and_a_bigger_grid_has_longer_distances():
    model = ViT("micro", img_size=16, **MICRO, pos_encoding="alibi_2d")  # 4 x 4 grid
    assert not list(model.pos.parameters()) and not [k for k in model.state_dict() if k.startswith("pos.")]
    q = torch.zeros(1, 4, 1 + 64, 16)
    model.resize(32)  # 8 x 8
    bias = model.pos.parts[0](q)[0]  # (h, T, T)
    # patch (0, 0) to patch (7, 7): 7 sqrt(2) patches apart, the longest distance of the new grid
    torch.testing.assert_close(bias[:, 1, 64], -alibi_slopes(4) * 7 * math.sqrt(2))
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 10)


def _random_peg(dim: int, grid, prefix: int) -> Peg:
    torch.manual_seed(1)
    peg = Peg(dim, 1, grid, prefix).double()
    for p in peg.parameters():
        p.data.normal_(0, 0.5)
    return peg


def test_peg_is_a_zero_padded_3x3_convolution_added_to_each_patch():
    peg = _random_peg(2, (2, 3), 1)
    x = torch.randn(1, 1 + 6, 2, dtype=torch.float64)
    out = peg(x)
    w, b = peg.proj.weight[:, 0], peg.proj.bias  # (D, 3, 3), (D,)
    assert torch.equal(out[:, 0], x[:, 0])  # the [class] token passes through
    for d in range(2):
        for r in range(2):
            for c in range(3):
                total = x[0, 1 + r * 3 + c, d] + b[d]
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        if 0 <= r + dy < 2 and 0 <= c + dx < 3:  # zero padding outside the grid
                            total = total + w[d, dy + 1, dx + 1] * x[0, 1 + (r + dy) * 3 + c + dx, d]
                torch.testing.assert_close(out[0, 1 + r * 3 + c, d], total)


def _pos_conv(peg: Peg):
    """timm's Twins PosConv with the PEG's kernels copied in."""
    twins = pytest.importorskip("timm.models.twins")
    conv = twins.PosConv(peg.proj.in_channels, peg.proj.out_channels).double()
    conv.load_state_dict({"proj.0.weight": peg.proj.weight, "proj.0.bias": peg.proj.bias})
    return conv


def test_peg_equals_timms_pos_conv():
    peg = _random_peg(16, (3, 5), 3)
    x = torch.randn(2, 3 + 15, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(peg(x)[:, 3:], _pos_conv(peg)(x[:, 3:], (3, 5)))
        assert torch.equal(peg(x)[:, :3], x[:, :3])


@pytest.mark.parametrize("injection,after", [("stem", [0]), ("every_layer", [0, 1, 2])])
def test_peg_acts_between_blocks_like_timms_pos_conv(injection, after):
    """stem: after block 0 (CPVT's default); every_layer: after every block but the last, one PEG each."""
    torch.manual_seed(0)
    model = ViT("micro", img_size=(12, 20), **MICRO, pos_encoding="peg", pos_injection=injection).double().eval()
    convs = [_pos_conv(part) for part in model.pos.parts]
    assert len(convs) == len(after)
    x = torch.randn(2, 1, 12, 20, dtype=torch.float64)
    with torch.no_grad():
        z = model.pool.prepend(model.stem(x))  # (B, 1 + 15, D): no position added at the stem
        for i, block in enumerate(model.blocks):
            z = block(z)
            if i in after:
                z = torch.cat([z[:, :1], convs[after.index(i)](z[:, 1:], (3, 5))], dim=1)
        torch.testing.assert_close(model.forward_features(x), model.pool(z))


def test_peg_works_at_any_grid_once_resized():
    model = ViT("micro", img_size=16, **MICRO, pos_encoding="peg")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"call model.resize\(\(32, 32\)\)"):
        model(torch.randn(1, 1, 32, 32))
    model.resize(32)
    assert model.pos.grid == (8, 8) and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize("options,message", [
    (dict(pos_encoding="peg", depth=1), "pos_encoding='peg' acts between blocks, so it needs depth >= 2; got depth=1"),
    (dict(pos_encoding="peg", pos_injection="every_layer_shared"),
     "pos_injection='every_layer_shared' is not allowed with pos_encoding='peg'; allowed: stem, every_layer"),
    (dict(pos_encoding="alibi_2d", pos_injection="every_layer"),
     "pos_injection='every_layer' is not allowed with pos_encoding='alibi_2d'; allowed: stem"),
    (dict(arch="swin", pos_encoding="peg", patch_size=2), "pos_encoding='peg' applies to arch=vit only, not "
     "arch=swin (see README); choose from: none, learned_1d, relative_bias_2d"),
    (dict(arch="swin", pos_encoding="alibi_2d", patch_size=2), "pos_encoding='alibi_2d' applies to arch=vit only, not arch=swin"),
])
def test_what_cannot_apply_is_refused_in_one_line(options, message):
    from vit_lightning.model.build import build_backbone

    with pytest.raises(ValueError) as error:
        build_backbone(**{"variant": "micro", "img_size": 28, "in_chans": 1, **options})
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("encoding", ["alibi_2d", "peg"])
def test_a_new_resolution_resamples_nothing_and_the_record_says_so(encoding):
    options = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, width=32, depth=2, heads=2, mlp_dim=64,
                   pos_encoding=encoding)
    torch.manual_seed(0)
    old = ViT(**options)
    source = Source(options, old.state_dict(), {"source": "test"})
    new = ViT(**{**options, "img_size": 56})
    start_from(new, source)
    assert all(torch.equal(v, new.state_dict()[k]) for k, v in old.state_dict().items())  # the same weights
    assert new.pos.grid == (8, 8) and new(torch.randn(1, 1, 56, 56)).shape == (1, 10)
    said = account(source, 7, 56)["pos_resize"]
    assert said["img_size"] == {"from": 28, "to": 56} and said["pos_encoding"] == encoding
    assert said["done"].startswith(f"{encoding}: nothing resampled")
    assert "pos_resize" not in account(source, 7, 28)  # the same grid: nothing to say


# ---- trained: a tiny fit, then `vit-ablate eval` at another size ----------------------------------------------------
TINY = [*TINY_MODEL, "--model.depth=2", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1", "--run.wandb=off", "--run.fewshot_shots=[]"]


@pytest.mark.slow
@pytest.mark.parametrize("encoding, extra", [("alibi_2d", []), ("peg", []), ("peg", ["--model.peg_padding=circular"])])
def test_eval_at_another_size_says_what_was_done(encoding, extra, tmp_path):
    assert train.main([*TINY, f"--model.pos_encoding={encoding}", *extra, f"--run.root={tmp_path}",
                       "--run.trial=src"]) == 0
    run = tmp_path / "adhoc/local/src"
    record = json.loads((run / "results.json").read_text())
    assert record["config"]["model.peg_padding"] == ("circular" if extra else "zeros")
    # ALiBi's two heads (slopes 2^-4, 2^-8) times the demo's 4x4 grid's longest distance, sqrt(3^2 + 3^2)
    expected = [round(2 ** -4 * math.sqrt(18), 4), round(2 ** -8 * math.sqrt(18), 4)] if encoding == "alibi_2d" else None
    assert record["compute"].get("pos_largest_bias") == expected
    assert cli.main(["eval", str(run), "--data.img_size=56", "--shots", "--out", str(tmp_path / "e.json")]) == 0
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["img_size"] == 56 and 0 <= out["metrics"]["val/acc"] <= 1
    assert out["source"]["pos_resize"]["done"].startswith(f"{encoding}: nothing resampled")
