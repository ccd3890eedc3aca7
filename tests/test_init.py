"""Initialisation: every initialised tensor's statistics against the formula of its scheme."""

import math

import pytest
import torch
from torch import nn

from vit_lightning.model import ViT

TRUNC = 0.87962566103423978  # std of a standard normal truncated at +-2


def _xavier(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    assert w.abs().max() <= bound + 1e-7
    assert w.abs().max() > 0.98 * bound  # uniform fills its range
    assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert abs(w.mean().item()) < 0.05 * bound


def _lecun(w: torch.Tensor) -> None:
    std = math.sqrt(1.0 / w[0].numel())
    assert w.std().item() == pytest.approx(std, rel=0.06)
    assert w.abs().max() <= 2 * std / TRUNC + 1e-7  # truncated at two of the untruncated stds


def _zero(t: torch.Tensor) -> None:
    assert torch.count_nonzero(t) == 0


def _model(**options) -> ViT:
    torch.manual_seed(0)
    return ViT("micro", width=128, mlp_dim=512, img_size=32, num_classes=10, patch_size=4, **options)


@pytest.mark.parametrize("pooling", ["cls", "gap", "map"])
def test_paper_init_encoder_patch_stem_and_heads(pooling):
    m = _model(pooling=pooling, head="mlp_tanh")
    d, mlp = 128, 512
    for block in m.blocks:
        for kernel in block.attn.qkv.weight.chunk(3, dim=0):  # query, key, value each (D, D)
            _xavier(kernel, d, d)
        _xavier(block.attn.proj.weight, d, d)
        _zero(block.attn.qkv.bias), _zero(block.attn.proj.bias)
        _xavier(block.mlp.fc1.weight, d, mlp)
        _xavier(block.mlp.fc2.weight, mlp, d)
        for bias in (block.mlp.fc1.bias, block.mlp.fc2.bias):
            assert 0 < bias.std().item() == pytest.approx(1e-6, rel=0.25)
        for norm in (block.norm1, block.norm2):
            assert torch.equal(norm.weight, torch.ones(d)) and torch.equal(norm.bias, torch.zeros(d))
    _lecun(m.stem.proj.weight)  # fan-in 3 * 4 * 4
    _zero(m.stem.proj.bias)
    hidden, _, classifier = m.head
    _lecun(hidden.weight)
    _zero(hidden.bias), _zero(classifier.weight), _zero(classifier.bias)
    assert m.pos.parts[0].table.std().item() == pytest.approx(0.02, rel=0.1)
    if pooling == "cls":
        _zero(m.pool.token)
    if pooling == "map":
        bound = math.sqrt(6.0 / (1 + d))
        assert m.pool.probe.abs().max() <= bound and m.pool.probe.std().item() == pytest.approx(bound / 3**0.5, rel=0.2)
        _xavier(m.pool.q.weight, d, d)
        for kernel in m.pool.kv.weight.chunk(2, dim=0):
            _xavier(kernel, d, d)
        _xavier(m.pool.mlp.fc1.weight, d, 4 * d)


def test_paper_init_hybrid_stem():
    m = _model(stem="hybrid", hybrid_layers=(1,), hybrid_width=32)
    convs = [c for c in m.stem.modules() if isinstance(c, nn.Conv2d)]
    assert len(convs) == 6  # root, three in the bottleneck, its downsample, the projection
    for conv in convs:
        if conv.weight.numel() >= 2048:  # enough samples for a 6% std check
            _lecun(conv.weight)
    _zero(m.stem.proj.bias)


def test_timm_init_is_truncated_normal_002():
    m = _model(init="timm", head="mlp_tanh")
    for layer in (m.blocks[0].attn.qkv, m.blocks[0].mlp.fc1, m.head[0]):
        assert layer.weight.std().item() == pytest.approx(0.02, rel=0.05)
        _zero(layer.bias)
    fan_in = m.stem.proj.weight[0].numel()  # PyTorch's conv default: kaiming_uniform(a=sqrt(5)) -> 1/sqrt(fan_in) bound
    assert m.stem.proj.weight.abs().max() <= 1 / math.sqrt(fan_in)
    _zero(m.head[2].weight)


def test_init_is_checked():
    with pytest.raises(ValueError, match="unknown model.init='jax'; choose from: paper, timm"):
        ViT("micro", init="jax")
    assert ViT("micro", img_size=32, patch_size=8).config.init == "paper"
