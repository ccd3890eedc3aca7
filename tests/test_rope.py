"""2-D RoPE: the rotation against complex multiplication by hand, prefix tokens untouched, the coordinate
conventions at a new grid, timm's RoPE Evas (NAVER's models) as an oracle, and bad options in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch

from vit_lightning import ViT
from vit_lightning.model.build import load_timm_weights, timm_twin
from vit_lightning.model.config import ModelConfig
from vit_lightning.model.layers import keeping_attention
from vit_lightning.model.position import ENCODINGS, Rope, RopeMixed
from vit_lightning.run.transfer import Source, account, read_source, start_from

ROPES = ["rope_axial", "rope_mixed", "learned_1d+rope_axial", "learned_1d+rope_mixed"]
SMALL = dict(img_size=28, patch_size=7, in_chans=1, num_classes=5, width=32, depth=2, heads=2, mlp_dim=64)


def by_hand(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """(..., N, hd) turned by (..., N, hd/2) angles: channel pairs as complex numbers times exp(i angle)."""
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


def test_axial_rotation_is_complex_multiplication_by_hand():
    rope = Rope(8, 1, (2, 3), num_prefix=1, rope_theta=100.0).double()  # hd = 8: 2 x-pairs, then 2 y-pairs
    q, k = torch.randn(2, 1, 7, 8, dtype=torch.float64), torch.randn(2, 1, 7, 8, dtype=torch.float64)
    rq, rk = rope.rotate(q, k)
    angle = torch.zeros(6, 4, dtype=torch.float64)
    for n in range(6):
        y, x = divmod(n, 3)  # raster order: row y, column x
        angle[n] = torch.tensor([x * 1.0, x * 0.1, y * 1.0, y * 0.1])  # theta^(-k/2): 1, 100^(-1/2)
    torch.testing.assert_close(rq[:, :, 1:], by_hand(q[:, :, 1:], angle))
    torch.testing.assert_close(rk[:, :, 1:], by_hand(k[:, :, 1:], angle))
    assert torch.equal(rq[:, :, :1], q[:, :, :1]) and torch.equal(rk[:, :, :1], k[:, :, :1])  # the [class] token


def test_mixed_rotation_uses_each_heads_learned_2d_frequencies():
    rope = RopeMixed(16, 2, (3, 2), num_prefix=2).double()  # two prefix tokens ([class] + a register)
    with torch.no_grad():
        rope.freqs.normal_()
    q = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    rq, _ = rope.rotate(q, q)
    fx, fy = rope.freqs.detach()  # (h, hd/2) each
    for n in range(6):
        y, x = divmod(n, 2)
        torch.testing.assert_close(rq[:, :, 2 + n], by_hand(q[:, :, 2 + n, None], (x * fx + y * fy)[:, None])[:, :, 0])
    assert torch.equal(rq[:, :, :2], q[:, :, :2])


def test_mixed_frequencies_start_as_naver_axial_magnitudes_along_a_random_direction_per_head():
    torch.manual_seed(0)
    fx, fy = RopeMixed(32, 4, (4, 4), 1).freqs.detach()  # hd = 8: magnitudes 1, 10^(-1/2)
    magnitude = torch.tensor([1.0, 10 ** -0.5, 1.0, 10 ** -0.5])
    torch.testing.assert_close(torch.hypot(fx, fy), magnitude.expand(4, 4))
    a = torch.atan2(fy[:, 0], fx[:, 0])  # each head's direction; the second half turned by 90 degrees
    torch.testing.assert_close(torch.atan2(fy[:, 2], fx[:, 2]), torch.remainder(a + math.pi / 2 + math.pi, 2 * math.pi) - math.pi)
    assert len(set(a.tolist())) == 4  # one direction per head


def test_rotated_logits_depend_on_the_offset_only():
    rope = Rope(16, 1, (5, 5), num_prefix=0).double()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    tokens = torch.stack([q, k]).expand(25, 2, 16).permute(1, 0, 2)[None]  # (1, 2 as heads, 25, 16)
    rq, rk = rope.rotate(tokens, tokens)
    logit = rq[0, 0] @ rk[0, 1].T  # (25, 25): query at i, key at j

    def at(y, x):
        return y * 5 + x

    assert logit[at(0, 0), at(1, 2)] == pytest.approx(logit[at(3, 2), at(4, 4)].item())  # the same offset (1, 2)
    assert logit[at(0, 0), at(1, 2)] != pytest.approx(logit[at(0, 0), at(2, 1)].item())


@pytest.mark.parametrize("encoding", ROPES)
def test_the_analysis_path_gives_the_fused_numbers(encoding):
    model = ViT(**SMALL, pos_encoding=encoding, reg_tokens=1).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        fused = model(x)
        with keeping_attention(model.blocks):
            explicit = model(x)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    maps = model.attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 18, 18)


@pytest.mark.parametrize("coords,expected", [
    ("patch", [0, 1, 2, 3, 4, 5, 6, 7]),  # new positions: extrapolation
    ("ref_grid", [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5]),  # the built 4 x 4 grid's extent: interpolation
    ("normalized", [2 * math.pi * ((i + 0.5) / 8 * 2 - 1) for i in range(8)]),  # centres in [-1, 1], 2 pi per unit
])
def test_coordinates_at_a_larger_grid_follow_the_convention(coords, expected):
    model = ViT(**SMALL, pos_encoding="rope_axial", rope_coords=coords)
    model.resize(56)
    xy = model.pos.rotations[1].xy  # (64, 2)
    torch.testing.assert_close(xy[:8, 0], torch.tensor(expected, dtype=torch.float32))  # the first row's x
    torch.testing.assert_close(xy[::8, 1], torch.tensor(expected, dtype=torch.float32))  # the first column's y


@pytest.mark.parametrize("encoding", ROPES)
def test_init_from_at_another_size_keeps_the_source_grid_and_says_what_was_done(encoding):
    torch.manual_seed(0)
    old = ViT(**SMALL, pos_encoding=encoding, rope_coords="ref_grid")
    source = Source({**SMALL, "pos_encoding": encoding, "rope_coords": "ref_grid"}, old.state_dict(), {"source": "t"})
    new = ViT(**{**SMALL, "img_size": 56}, pos_encoding=encoding, rope_coords="ref_grid").eval()
    start_from(new, source)
    assert new.pos.rotations[0].ref.tolist() == [4, 4]  # the training grid, not the 8 x 8 it was built for
    old.resize(56)
    x = torch.randn(2, 1, 56, 56)
    with torch.no_grad():
        torch.testing.assert_close(new(x), old.eval()(x))
    note = account(source, 7, 56)["pos_resize"]["done"]
    assert note.endswith(f"{encoding.split('+')[-1]}: nothing resampled: coordinates ref_grid (model.rope_coords says "
                         "where the new grid's patches are)")
    assert note.startswith("learned_1d: patch rows interpolated") == encoding.startswith("learned_1d+")
    assert "pos_resize" not in account(source, 7, 28)  # the same grid: nothing done


# ---- timm's RoPE Evas (NAVER's RoPE-ViT models) as the oracle -------------------------------------

NAVER = ["vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224", "vit_small_patch16_rope_ape_224",
         "vit_small_patch16_rope_mixed_ape_224"]
NARROW = dict(depth=2, embed_dim=64, num_heads=4, num_classes=7, img_size=64, dynamic_img_size=True)


def _eva(name: str):
    torch.manual_seed(0)
    eva = timm.create_model(name, pretrained=False, **NARROW).eval()
    with torch.no_grad():
        for p in eva.parameters():
            p.normal_(0, 0.2)  # layer scale and frequencies away from their start, so every part shows in the logits
    return eva


@pytest.mark.parametrize("name", NAVER)
def test_our_rope_vit_gives_timm_logits_at_its_size_and_another(name):
    eva = _eva(name)
    options, ours = timm_twin(eva)
    assert options["pos_encoding"] == ("learned_1d+" if "ape" in name else "") + ("rope_mixed" if "mixed" in name else "rope_axial")
    assert options["layer_scale"] is not None and options["pooling"] == "cls"
    ours.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), eva(x), atol=1e-5, rtol=1e-5)
        plain = ViT(**{k: v for k, v in options.items() if k not in ("arch", "rope_theta", "rope_coords")}
                    | {"pos_encoding": "learned_1d" if "ape" in name else "none"}).eval()
        plain.load_state_dict({k: v for k, v in ours.state_dict().items() if "rotations" not in k})
        assert not torch.allclose(plain(x), eva(x), atol=1e-3)  # the rotation matters
        ours.resize((96, 80))  # timm: dynamic_img_size, the ape table resampled bicubically as ours
        x = torch.randn(2, 3, 96, 80)
        torch.testing.assert_close(ours(x), eva(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAVER)
def test_the_full_naver_architectures_give_timm_logits_at_224_px_and_at_320(name):
    """Every block of ViT-S/16 (12 x 384, 6 heads) at 224 px, then at 320 px (timm: dynamic_img_size)."""
    torch.manual_seed(0)
    eva = timm.create_model(name, pretrained=False, num_classes=10, dynamic_img_size=True).eval()
    with torch.no_grad():
        for key, p in eva.named_parameters():  # away from their start: every part, layer scale included, shows
            p.uniform_(0.1, 0.5) if "gamma" in key else p.add_(torch.randn_like(p) * 0.02)
    options, ours = timm_twin(eva)
    assert (options["img_size"], options["depth"], options["width"], options["heads"]) == ([224, 224], 12, 384, 6)
    ours.eval()
    for size in (224, 320):
        if size != 224:
            ours.resize(size)
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            want = eva(x)
            assert (want[0] - want[1]).abs().max() > 0.1  # logits that depend on the image
            torch.testing.assert_close(ours(x), want, atol=1e-4, rtol=1e-4)


def test_init_from_a_timm_rope_file_gives_timm_logits(tmp_path, monkeypatch):
    name = "vit_small_patch16_rope_mixed_ape_224"
    eva = _eva(name)
    weights = tmp_path / "w.pth"
    torch.save(eva.state_dict(), weights)
    create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda n, **kw: create(n, **{**NARROW, **kw}))
    source = read_source(f"timm:{name}@{weights}")
    assert source.options["pos_encoding"] == "learned_1d+rope_mixed" and source.options["pos_embed_class"] is False
    ours = ViT(**{**source.options, "img_size": 64}).eval()
    start_from(ours, source)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), eva(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("change,reason", [
    (dict(rope_type="dinov3"), "not NAVER's axial or mixed RoPE"),
    (dict(ref_feat_shape=(2, 2)), "not NAVER's axial or mixed RoPE"),
    (dict(swiglu_mlp=True), "SwiGLU"),
    (dict(use_rot_pos_emb=False), "no RoPE"),
])
def test_timm_evas_we_cannot_express_are_refused_in_one_line(change, reason):
    eva = timm.create_model("vit_small_patch16_rope_224", pretrained=False, **{**NARROW, **change})
    with pytest.raises(ValueError, match=reason) as error:
        timm_twin(eva)
    assert "\n" not in str(error.value)


def test_a_mismatched_model_is_refused_before_copying():
    eva = _eva("vit_small_patch16_rope_224")
    ours = ViT(img_size=64, patch_size=16, width=64, depth=2, heads=4, mlp_dim=256, num_classes=7, layer_scale=1e-5,
               pos_encoding="rope_mixed")
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match="pos_encoding='rope_axial'"):
        load_timm_weights(ours, eva)
    assert all(torch.equal(v, ours.state_dict()[k]) for k, v in before.items())


# ---- options -------------------------------------------------------------------------------------

@pytest.mark.parametrize("options,message", [
    (dict(pos_encoding="rope_axial", width=24, heads=4), r"head width \(width / heads\) divisible by 4"),
    (dict(pos_encoding="rope_mixed", rope_theta=0), "rope_theta must be a positive"),
    (dict(pos_encoding="rope_axial", rope_theta=-1.0), "rope_theta must be a positive"),
    (dict(pos_encoding="learned_1d", rope_theta=10.0), "applies to pos_encoding=rope_axial or rope_mixed or "),
    (dict(pos_encoding="relative_bias_2d", rope_coords="ref_grid"), "applies to pos_encoding=rope_axial or rope_mixed or "),
    (dict(pos_encoding="rope_axial", rope_coords="pixels"), "unknown model.rope_coords='pixels'; choose from: patch"),
    (dict(pos_encoding="rope_axial", pos_injection="every_layer"), "allowed: stem"),
    (dict(arch="swin", pos_encoding="rope_mixed"), "arch=vit only"),
    (dict(arch="swin", rope_theta=10.0), "rope_theta=10.0 applies to arch=vit only"),
])
def test_bad_rope_options_are_one_line(options, message):
    with pytest.raises(ValueError, match=message) as error:
        ModelConfig(**options)
    assert "\n" not in str(error.value)


def test_every_rope_encoding_is_rotary_and_declares_its_injections():
    for name in ROPES:
        assert ENCODINGS[name].rotary and ENCODINGS[name].injections == ("stem",)
    assert not any(ENCODINGS[n].rotary for n in ENCODINGS if n not in ROPES and "rope" not in n)


# ---- figures -------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["rope_axial", "learned_1d+rope_mixed"])
def test_rope_figures_and_the_ones_that_do_not_apply(encoding, tmp_path):
    from vit_lightning.commands.viz import analysis
    from vit_lightning.commands.viz.rope import offset_logits
    from vit_lightning.commands.viz.run import Run, compute, draw

    torch.manual_seed(0)
    vit = ViT(**{**SMALL, "img_size": (21, 28)}, pos_encoding=encoding, reg_tokens=1).double().eval()  # 3 x 4 grid
    images = torch.randn(3, 1, 21, 28, dtype=torch.float64)
    numbers = compute(Run(vit, images, None, tmp_path))
    maps = vit.attention_maps(images)
    assert np.allclose(numbers.distance, analysis.mean_attention_distance(maps, (3, 4), 7.0, 2).numpy())
    # the mean logit at offset (query - key) = (1, -2), by a loop over the patch pairs at that offset
    inputs = []
    hook = vit.blocks[1].attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    vit(images)
    hook.remove()
    attn = vit.blocks[1].attn
    q, k, _ = attn.qkv(inputs[0]).view(3, 14, 3, 2, 16).permute(2, 0, 3, 1, 4)
    q, k = vit.pos.rotations[1].rotate(q, k)
    pairs = [(i, j) for i in range(12) for j in range(12) if (i // 4 - j // 4, i % 4 - j % 4) == (1, -2)]
    want = np.mean([(q[:, 1, 2 + i] * k[:, 1, 2 + j]).sum(-1).mean().item() / 4 for i, j in pairs])
    assert offset_logits(vit, images, (3, 4))[1, 1, 1 + 2, -2 + 3] == pytest.approx(want)
    names = {p.name for p in draw(numbers, tmp_path)}
    assert {"rope_offsets.png", "rope_offsets.csv", "attention_distance.png", "rollout.png"} <= names
    if encoding == "rope_axial":
        assert "no similarity to draw" in (tmp_path / "pos_similarity.txt").read_text()
        assert "fixed" in (tmp_path / "rope_frequencies.txt").read_text()
    else:
        assert {"pos_similarity.png", "rope_frequencies.png"} <= names  # the ape table and the learned frequencies
        assert len((tmp_path / "rope_frequencies.csv").read_text().splitlines()) == 1 + 2 * 2 * 8  # layers x heads x pairs


# ---- end to end: a RoPE run evaluated and fine-tuned at another size -------------------------------

@pytest.mark.slow
def test_a_rope_run_is_evaluated_and_fine_tuned_at_another_size_and_the_records_say_what_was_done(tmp_path):
    import json

    from tiny import TINY_MODEL

    from vit_lightning import cli
    from vit_lightning.commands.fit import main as train

    tiny = [*TINY_MODEL, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
            "--run.wandb=off", "--run.fewshot_shots=[]", f"--run.root={tmp_path}"]
    src = ["--model.pos_encoding=learned_1d+rope_mixed", "--model.rope_coords=ref_grid", "--run.trial=src"]
    assert train.main([*tiny, *src]) == 0
    run = tmp_path / "adhoc/local/src"
    assert cli.main(["eval", str(run), "--data.img_size=56", "--shots"]) == 0
    said = ("learned_1d: patch rows interpolated as a 2-D image (bicubic), prefix rows kept; rope_mixed: nothing "
            "resampled: coordinates ref_grid (model.rope_coords says where the new grid's patches are)")
    assert json.loads((run / "eval-mnist5k-56px.json").read_text())["source"]["pos_resize"]["done"] == said
    assert train.main([*tiny, f"--model.init_from={run}", "--data.img_size=56"]) == 0
    [record] = tmp_path.glob("adhoc/local/ft-*/results.json")
    record = json.loads(record.read_text())
    assert record["init_from"]["pos_resize"]["done"] == said and record["status"] == "completed"
    assert record["config"]["model.rope_coords"] == "ref_grid"  # from the source
