"""Poolings and heads against hand computations: the paper's GAP, timm's fc_norm GAP, head init, no decay."""

from __future__ import annotations

import pytest
import torch

from vit_lightning import ViT
from vit_lightning.run.module import Classifier, decay_groups

MICRO = dict(img_size=28, in_chans=1, num_classes=10, patch_size=4)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm over the last axis, written out."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def pool_with_random_norm(name: str) -> torch.nn.Module:
    pool = ViT("micro", **MICRO, pooling=name).pool.double()
    torch.manual_seed(0)
    pool.norm.weight.data.normal_(1.0, 0.3)
    pool.norm.bias.data.normal_(0.0, 0.3)
    return pool


def tokens() -> torch.Tensor:
    """Hand-built (2, 5, 64) tokens whose scales and offsets differ from token to token, as real ones do."""
    torch.manual_seed(1)
    scale = torch.tensor([0.2, 1.0, 3.0, 0.5, 8.0], dtype=torch.float64).view(1, 5, 1)
    shift = torch.tensor([-2.0, 0.0, 1.0, 4.0, -1.0], dtype=torch.float64).view(1, 5, 1)
    return torch.randn(2, 5, 64, dtype=torch.float64) * scale + shift


def test_gap_is_layer_norm_on_every_token_then_the_mean():
    pool, x = pool_with_random_norm("gap"), tokens()
    expected = torch.stack([layer_norm(x[:, i], pool.norm.weight, pool.norm.bias) for i in range(5)]).mean(0)
    torch.testing.assert_close(pool(x), expected, rtol=0, atol=1e-12)


def test_gap_fcnorm_is_the_mean_then_layer_norm():
    pool, x = pool_with_random_norm("gap_fcnorm"), tokens()
    expected = layer_norm(sum(x[:, i] for i in range(5)) / 5, pool.norm.weight, pool.norm.bias)
    torch.testing.assert_close(pool(x), expected, rtol=0, atol=1e-12)


def test_the_two_gap_flavours_differ():
    paper, timm_style, x = pool_with_random_norm("gap"), pool_with_random_norm("gap_fcnorm"), tokens()
    assert torch.equal(paper.norm.weight, timm_style.norm.weight)  # same parameters, different places
    assert (paper(x) - timm_style(x)).abs().max() > 0.1


def test_gap_fcnorm_cls_keeps_a_class_token_out_of_the_mean():
    pool, x = pool_with_random_norm("gap_fcnorm_cls"), tokens()
    assert pool.prepend(x[:, 1:]).shape == (2, 5, 64)  # the token joins the encoder's sequence
    expected = layer_norm(x[:, 1:].mean(1), pool.norm.weight, pool.norm.bias)
    torch.testing.assert_close(pool(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("init, std", [("paper", 64**-0.5), ("timm", 0.02)])
def test_mlp_tanh_hidden_layer_gets_the_models_init(init, std):
    torch.manual_seed(0)
    model = ViT("micro", **MICRO, head="mlp_tanh", init=init)
    hidden, out = model.head[0], model.head[2]
    assert torch.equal(hidden.bias, torch.zeros(64))
    # PyTorch's default would be uniform with std 1/sqrt(3 * 64) = 0.072; paper: lecun_normal, timm: 0.02
    assert abs(hidden.weight.std().item() - std) < 0.1 * std
    assert torch.equal(out.weight, torch.zeros(10, 64)) and torch.equal(out.bias, torch.zeros(10))


def test_attention_pool_probe_gets_no_weight_decay():
    module = Classifier(**MICRO, pooling="map", weight_decay=0.1)
    probe = module.model.pool.probe
    assert "pool.probe" in module.model.no_weight_decay()
    groups = decay_groups(module.model, 0.1)
    no_decay = [g for g in groups if g["weight_decay"] == 0.0]
    assert any(p is probe for g in no_decay for p in g["params"])
    assert not any(p is probe for g in groups if g["weight_decay"] > 0 for p in g["params"])


def test_gap_pools_as_layer_norm_on_every_token_then_the_mean_in_float32_too():
    pool = pool_with_random_norm("gap").float()
    x = tokens().float() * 10
    torch.testing.assert_close(pool(x), pool.norm(x).mean(dim=1), rtol=1e-5, atol=1e-5)  # the affine moved after the mean


@pytest.mark.parametrize("pooling", ["cls", "gap", "gap_fcnorm", "gap_fcnorm_cls", "map"])
@pytest.mark.parametrize("stem", ["patch", "hybrid"])
def test_every_block_gets_contiguous_tokens_with_or_without_a_class_token(pooling, stem):
    # A strided residual stream (the patch conv's channel-major layout, kept by every elementwise op when no
    # [class] token is concatenated) made GAP and MAP steps 11-17% slower than CLS on a GPU.
    options = {"hybrid_layers": [1, 1], "hybrid_width": 32, "patch_size": 1} if stem == "hybrid" else {"patch_size": 4}
    model = ViT("micro", img_size=32, num_classes=10, width=32, depth=2, heads=2, mlp_dim=64, pooling=pooling,
                stem=stem, **options)
    seen = []
    for block in model.blocks:
        block.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0], output)))
    model(torch.randn(2, 3, 32, 32))
    assert len(seen) == 2 and all(x.is_contiguous() and y.is_contiguous() for x, y in seen)
