"""LookHere and FIRE against bias matrices worked out by hand from the papers' formulas on tiny grids; both run at
any grid, rebuilt by their own rule, and leave the [class] row and column unbiased."""

from __future__ import annotations

import math

import pytest
import torch
from test_model import naive_attention

from vit_lightning import ViT
from vit_lightning.model.bias2d import Fire2d, LookHere, LookHere45, LookHere90, fire_inputs, lookhere_bias

I = -math.inf  # noqa: E741  (a masked key)
A, B = 0.75, 0.75 * math.sqrt(2)  # slope 1.5 (the only block) x head slope 1/2, times distances 1 and sqrt(2)
MICRO = dict(in_chans=1, num_classes=4, patch_size=4)


def test_lookhere_180_right_head_sees_its_half_plane_with_distance_penalties():
    # 2x2 grid, raster 0 (r0 c0), 1 (r0 c1), 2 (r1 c0), 3 (r1 c1); head 0 looks right: keys with dx >= 0
    expected = torch.tensor([[0, -A, -A, -B],
                             [I, 0, I, -A],
                             [-A, -B, 0, -A],
                             [I, -A, I, 0]], dtype=torch.float64)
    torch.testing.assert_close(lookhere_bias((2, 2), 180, 4, 1.5)[0], expected)


def test_lookhere_90_up_head_sees_the_triangle_between_the_diagonals():
    # head 1 looks up: keys with dy >= |dx| above the query (diagonals included); the query itself always
    expected = torch.tensor([[0, I, I, I],
                             [I, 0, I, I],
                             [-A, -B, 0, I],
                             [-B, -A, I, 0]], dtype=torch.float64)
    torch.testing.assert_close(lookhere_bias((2, 2), 90, 4, 1.5)[1], expected)


def test_lookhere_45_first_head_sees_the_octant_from_right_to_up_right():
    # head 0 looks at 22.5 degrees: offsets between 0 (right) and 45 (up-right) degrees, both edges included
    expected = torch.tensor([[0, -A, I, I],
                             [I, 0, I, I],
                             [I, -B, 0, -A],
                             [I, I, I, 0]], dtype=torch.float64)
    torch.testing.assert_close(lookhere_bias((2, 2), 45, 4, 1.5)[0], expected)


def test_lookhere_slopes_fall_with_depth_and_halve_every_four_heads_and_the_class_token_is_unbiased():
    model = ViT("micro", img_size=8, **MICRO, depth=3, heads=8, width=64, pos_encoding="lookhere_180")  # 2x2 grid
    q = torch.zeros(1, 8, 5, 8)
    for layer, slope in enumerate((1.5, 1.0, 0.5)):  # the ramp from 1.5 (first block) to 0.5 (last)
        bias = model.pos.attention_bias(layer)(q)[0]  # (h, T, T)
        assert torch.equal(bias[:, 0], torch.zeros(8, 5)) and torch.equal(bias[:, :, 0], torch.zeros(8, 5))
        # query patch 0 to key patch 3 (diagonal down-right, sqrt 2 away), seen by the right-looking heads 0 and 4
        torch.testing.assert_close(bias[0, 1, 4], torch.tensor(-slope * 0.5 * math.sqrt(2)))
        torch.testing.assert_close(bias[4, 1, 4], torch.tensor(-slope * 0.25 * math.sqrt(2)))
        assert bias[1, 1, 4] == -math.inf  # the up-looking head does not see below


@pytest.mark.parametrize("kind, fov", [(LookHere, 180), (LookHere90, 90), (LookHere45, 45)])
def test_lookhere_is_rebuilt_for_a_new_grid_and_attention_stays_finite(kind, fov):
    part = kind(64, 4, (2, 2), 1, layer=0, depth=1)
    part.resample((3, 5))
    assert part.bias.shape == (4, 16, 16)
    torch.testing.assert_close(part.bias[:, 1:, 1:], lookhere_bias((3, 5), fov, 4, 1.5).float())
    model = ViT("micro", img_size=8, **MICRO, pos_encoding=f"lookhere_{fov}", pooling="gap")
    model.resize(40)  # 10x10 tokens: every row keeps its own key, so no softmax is over nothing
    assert torch.isfinite(model(torch.randn(2, 1, 40, 40))).all()


def test_fire_inputs_are_progressively_interpolated_offsets():
    c = torch.tensor(0.1)
    # a 1x3 grid, L = 2 (its start: the side - 1): every query divides by psi(2) = log(1.2)
    u = fire_inputs((1, 3), c, torch.tensor(2.0))
    psi = lambda x: math.log(0.1 * x + 1)  # noqa: E731
    expected_x = torch.tensor([[0, psi(1), psi(2)], [-psi(1), 0, psi(1)], [-psi(2), -psi(1), 0]]) / psi(2)
    torch.testing.assert_close(u[..., 0], expected_x)
    assert torch.equal(u[..., 1], torch.zeros(3, 3))  # one row: no vertical offsets
    # L = 0.5: each query divides by psi of its own reach (2, 1, 2): the middle one sees +-1 at the ends
    u = fire_inputs((1, 3), c, torch.tensor(0.5))
    torch.testing.assert_close(u[1, :, 0], torch.tensor([-1.0, 0.0, 1.0]))
    torch.testing.assert_close(u[0, :, 0], torch.tensor([0.0, psi(1) / psi(2), 1.0]))


def test_fire_bias_is_its_mlp_of_the_inputs_and_a_larger_grid_keeps_them_in_range():
    fire = Fire2d(8, 2, (1, 3), 1).double()
    assert fire.threshold.item() == 2.0 and fire.c.item() == pytest.approx(0.1)
    with torch.no_grad():  # hidden 0 = relu(u_x), hidden 1 = relu(-u_x); head 0 = 2 h0 - 3 h1 + 0.5, head 1 = u_y
        for p in fire.mlp.parameters():
            p.zero_()
        fire.mlp[0].weight[0, 0], fire.mlp[0].weight[1, 0], fire.mlp[0].weight[2, 1] = 1.0, -1.0, 1.0
        fire.mlp[2].weight[0, 0], fire.mlp[2].weight[0, 1], fire.mlp[2].bias[0] = 2.0, -3.0, 0.5
        fire.mlp[2].weight[1, 2] = 1.0
    bias = fire(torch.zeros(1, 2, 4, 4, dtype=torch.float64))[0]  # (h, T, T)
    r = math.log(1.1) / math.log(1.2)
    torch.testing.assert_close(bias[0, 1:, 1:], torch.tensor([[0.5, 2 * r + 0.5, 2.5], [0.5 - 3 * r, 0.5, 2 * r + 0.5],
                                                              [-2.5, 0.5 - 3 * r, 0.5]], dtype=torch.float64))
    assert torch.equal(bias[:, 0], torch.zeros(2, 4)) and torch.equal(bias[:, :, 0], torch.zeros(2, 4))
    fire.resample((9, 9))
    u = fire_inputs((9, 9), fire.c, fire.threshold)
    assert u.abs().max() <= 1 + 1e-12 and fire(torch.zeros(1, 2, 82, 4, dtype=torch.float64)).shape == (1, 2, 82, 82)


def test_fire_attention_adds_its_bias_to_the_logits():
    torch.manual_seed(0)
    model = ViT("micro", img_size=(8, 12), **MICRO, pos_encoding="fire_2d").double()
    fire, attn = model.pos.parts[1], model.blocks[1].attn
    table = fire(torch.zeros(1, 4, 7, 16, dtype=torch.float64))[0].detach()
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    torch.testing.assert_close(attn(x, fire), naive_attention(x, attn, lambda b, h, i, j, q: float(table[h, i, j])))
