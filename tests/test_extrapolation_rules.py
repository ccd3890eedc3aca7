"""How an encoding meets a larger grid: pos_resample=keep keeps every trained entry bit for bit (offsets beyond the
trained range clamped to the edge), and RoPE's frequency rules for larger grids (NTK-aware, YaRN) against their
formulas."""

from __future__ import annotations

import math

import pytest
import torch

from vit_lightning import ViT
from vit_lightning.model import rope
from vit_lightning.model.position import KEEP, edge_index, resize_note, set_frequency_rule

MICRO = dict(in_chans=1, num_classes=4, patch_size=6)


def test_relative_bias_2d_offsets_are_bit_identical_after_the_offset_keeping_resample():
    torch.manual_seed(0)
    model = ViT("micro", img_size=36, **MICRO, pos_encoding="relative_bias_2d")  # 6x6: offsets -5..5
    old = model.pos.parts[0].table.detach().clone()  # (h, 11, 11)
    model.resize(60, mode=KEEP)  # 10x10: offsets -9..9
    new = model.pos.parts[0].table.detach()
    assert new.shape == (4, 19, 19)
    assert torch.equal(new[:, 4:15, 4:15], old)  # offset (dr, dc) in the trained range: its trained bias, exactly
    assert torch.equal(new[:, 0], new[:, 4]) and torch.equal(new[:, :, 18], new[:, :, 14])  # -9 reads -5, +9 reads +5
    assert torch.equal(new[:, 0, 0], old[:, 0, 0]) and torch.equal(new[:, 18, 2], old[:, 10, 0])
    # what the attention reads: patch (0, 0) -> (0, 1) is offset (0, -1) on either grid, the same number
    q = torch.zeros(1, 4, 101, 16)
    assert torch.equal(model.pos.parts[0](q)[0, :, 1, 2], old[:, 5, 4])
    assert model(torch.randn(1, 1, 60, 60)).shape == (1, 4)


def test_interpolation_instead_rescales_the_offsets():
    torch.manual_seed(0)
    model = ViT("micro", img_size=36, **MICRO, pos_encoding="relative_bias_2d")
    old = model.pos.parts[0].table.detach().clone()
    model.resize(60)  # bicubic: offset +1 of the new grid reads the trained bias near +0.58
    assert not torch.equal(model.pos.parts[0].table.detach()[:, 4:15, 4:15], old)


@pytest.mark.parametrize("encoding", ["learned_1d", "learned_2d"])
def test_learned_tables_keep_their_trained_rows_top_left_and_repeat_the_edge(encoding):
    torch.manual_seed(0)
    model = ViT("micro", img_size=36, **MICRO, pos_encoding=encoding)
    before = model.pos.parts[0].embedding().detach().clone()  # (1 + 36, D)
    model.resize(48, mode=KEEP)  # 8x8
    after = model.pos.parts[0].embedding().detach()
    old, new = before[1:].reshape(6, 6, -1), after[1:].reshape(8, 8, -1)
    assert torch.equal(after[0], before[0]) and torch.equal(new[:6, :6], old)
    assert torch.equal(new[7, 7], old[5, 5]) and torch.equal(new[2, 7], old[2, 5]) and torch.equal(new[6, 1], old[5, 1])


def test_edge_index_clamps_to_the_trained_range():
    assert edge_index(5, 3).tolist() == [0, 1, 2, 2, 2]
    assert edge_index(7, 3, centred=True).tolist() == [0, 0, 0, 1, 2, 2, 2]  # offsets -3..3 onto -1..1
    assert edge_index(3, 7, centred=True).tolist() == [2, 3, 4]  # a smaller grid: its offsets, as trained


def test_the_record_says_which_rule_met_the_grid():
    assert resize_note("relative_bias_2d", KEEP) == ("relative_bias_2d: trained offsets kept, offsets beyond the trained "
                                                     "range clamped to the edge offsets' biases")
    assert resize_note("relative_bias_2d", "bicubic") == "relative_bias_2d: offset table interpolated (bicubic)"
    assert resize_note("alibi_2d", KEEP) == resize_note("alibi_2d", "bicubic")  # nothing learned: no rule to choose


def test_ntk_scaling_is_a_larger_base_and_leaves_the_highest_frequency():
    freqs = rope.axial_frequencies(16, 100.0)  # 4 pairs per axis: q = 4
    got = rope.scaled_frequencies(freqs, (12, 12), (6, 6), "ntk")  # s = 2 on both axes
    torch.testing.assert_close(got, rope.axial_frequencies(16, 100.0 * 2 ** (4 / 3)))  # theta s^(q/(q-1))
    assert got[0, 0] == freqs[0, 0] and torch.isclose(got[0, 3], freqs[0, 3] / 2)  # highest kept, lowest / s
    assert torch.equal(rope.scaled_frequencies(freqs, (6, 6), (6, 6), "ntk"), freqs)  # the trained grid: unchanged
    assert torch.equal(rope.scaled_frequencies(freqs, (12, 12), (6, 6), "none"), freqs)


def test_yarn_interpolates_slow_frequencies_keeps_fast_ones_and_ramps_between():
    fx = torch.tensor([40.0, 10.0, 1.0, 0.0], dtype=torch.float64)  # turns over 6 patches: 38.2, 9.55, 0.95, 0
    freqs = torch.stack([fx, torch.zeros(4, dtype=torch.float64)])
    got = rope.scaled_frequencies(freqs, (6, 12), (6, 6), "yarn")  # twice as wide, as high as trained
    gamma = (6 * 10.0 / (2 * math.pi) - 1) / (32 - 1)  # YaRN's ramp at r = L / wavelength, alpha 1, beta 32
    torch.testing.assert_close(got[0], torch.tensor([40.0, 10.0 * ((1 - gamma) / 2 + gamma), 0.5, 0.0],
                                                    dtype=torch.float64))
    assert torch.equal(got[1], freqs[1])
    assert rope.yarn_scale((6, 12), (6, 6)) == pytest.approx(0.1 * math.log(2) + 1)


def test_ntk_on_a_model_equals_the_model_built_with_the_larger_base():
    torch.manual_seed(0)
    model = ViT("micro", img_size=36, **MICRO, pos_encoding="rope_axial")
    model.resize(72)
    assert set_frequency_rule(model, "ntk") == 4  # one RoPE per block
    twin = ViT("micro", img_size=72, **MICRO, pos_encoding="rope_axial", rope_theta=100.0 * 2 ** (4 / 3))
    torch.testing.assert_close(model.pos.rotation(0).angles(), twin.pos.rotation(0).angles())


def test_yarn_sharpens_the_logits_of_a_larger_grid():
    model = ViT("micro", img_size=36, **MICRO, pos_encoding="rope_mixed")
    model.resize(72)
    part = model.pos.rotation(1)
    q, k = torch.randn(1, 4, 145, 16), torch.randn(1, 4, 145, 16)
    plain = part.rotate(q, k)
    set_frequency_rule(model, "yarn")
    scaled = part.rotate(q, k)
    torch.testing.assert_close(scaled[0][:, :, 0], q[:, :, 0] * (0.1 * math.log(2) + 1))  # [class]: scaled, not turned
    assert not torch.allclose(scaled[0][:, :, 1:], plain[0][:, :, 1:] * (0.1 * math.log(2) + 1))  # slower turns


@pytest.mark.parametrize("options, message", [
    (dict(pos_encoding="alibi_2d"), "rope scaling 'ntk' changes RoPE's frequencies, and this model has no RoPE"),
    (dict(pos_encoding="rope_axial", rope_coords="normalized"),
     "rope scaling 'ntk' applies to rope_coords=patch (coordinates that extrapolate); this model's are normalized"),
])
def test_a_rule_that_cannot_apply_is_refused_in_one_line(options, message):
    model = ViT("micro", img_size=36, **MICRO, **options)
    with pytest.raises(ValueError) as error:
        set_frequency_rule(model, "ntk")
    assert message in str(error.value)
    with pytest.raises(ValueError, match="unknown rope scaling='ntk2'; choose from: none, ntk, yarn"):
        set_frequency_rule(model, "ntk2")
