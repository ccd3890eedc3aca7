"""load_timm_weights: every timm structure it accepts gives timm's logits; every other one is refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from vit_lightning import ViT, load_timm_weights

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import ResPostBlock, VisionTransformer  # noqa: E402

SIZES = dict(img_size=32, patch_size=8, num_classes=7)
TIMM = dict(SIZES, embed_dim=64, depth=2, num_heads=4)
OURS = dict(SIZES, width=64, depth=2, heads=4, mlp_dim=256)


def _randomise(module: nn.Module) -> nn.Module:
    """Random weights everywhere (norms and biases too), so a misplaced norm or dropped bias shows."""
    torch.manual_seed(1)
    for p in module.parameters():
        p.data.normal_(0, 0.1)
    return module.eval()


def _mlp_tanh(reference: VisionTransformer) -> VisionTransformer:
    """A timm model whose head is the paper's MLP with one tanh hidden layer (timm 1.x has no representation_size)."""
    reference.head = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 7))
    return reference


ACCEPTED = {
    "class token": (dict(), dict(pooling="cls")),
    "class token, fc_norm": (dict(fc_norm=True), dict(pooling="cls")),
    "avg, fc_norm (timm default)": (dict(class_token=False, global_pool="avg"), dict(pooling="gap_fcnorm")),
    "avg, no fc_norm (paper)": (dict(class_token=False, global_pool="avg", fc_norm=False), dict(pooling="gap")),
    "class token + avg": (dict(global_pool="avg"), dict(pooling="gap_fcnorm_cls")),
    "map": (dict(class_token=False, global_pool="map"), dict(pooling="map")),
    "no qkv bias": (dict(qkv_bias=False), dict(pooling="cls")),
    "no position for the class token": (dict(no_embed_class=True), dict(pooling="cls")),
    "no position table": (dict(pos_embed="none"), dict(pooling="cls", pos_encoding="none")),
}


@pytest.mark.parametrize("timm_options,our_options", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_timm_models_give_equal_logits(timm_options, our_options):
    reference = _randomise(VisionTransformer(**TIMM, **timm_options))
    ours = ViT(**OURS, **our_options).eval()
    load_timm_weights(ours, reference)
    x = torch.randn(3, 3, 32, 32)
    assert (ours(x) - reference(x)).abs().max() < 1e-5


def test_mlp_tanh_head_gives_equal_logits():
    reference = _randomise(_mlp_tanh(VisionTransformer(**TIMM)))
    ours = ViT(**OURS, head="mlp_tanh").eval()
    load_timm_weights(ours, reference)
    x = torch.randn(3, 3, 32, 32)
    assert (ours(x) - reference(x)).abs().max() < 1e-5


def _hybrid_backbone(**options):
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2

    settings = {**dict(preact=False, stem_type="same", conv_layer=partial(StdConv2dSame, eps=1e-8)), **options}
    return ResNetV2(layers=(1, 1), channels=(128, 256), stem_chs=32, num_classes=0, global_pool="", **settings)


def _hybrid_timm(backbone) -> VisionTransformer:
    from timm.models.vision_transformer_hybrid import HybridEmbed

    return VisionTransformer(img_size=28, patch_size=1, num_classes=7, embed_dim=64, depth=2, num_heads=4,
                             embed_layer=partial(HybridEmbed, backbone=backbone))


def _hybrid_ours() -> ViT:
    return ViT(img_size=28, num_classes=7, width=64, depth=2, heads=4, mlp_dim=256,
               stem="hybrid", hybrid_layers=(1, 1), hybrid_width=32).eval()


def test_hybrid_gives_equal_logits():
    reference = _randomise(_hybrid_timm(_hybrid_backbone()))
    ours = _hybrid_ours()
    load_timm_weights(ours, reference)
    x = torch.randn(2, 3, 28, 28)
    assert (ours(x) - reference(x)).abs().max() < 1e-5


REFUSED = {
    "class token + avg without fc_norm": (dict(global_pool="avg", fc_norm=False), "class token, global_pool='avg' and fc_norm=False"),
    "max pooling": (dict(class_token=False, global_pool="max"), "global_pool='max'"),
    "map with a class token": (dict(global_pool="map"), "global_pool='map' and a class token"),
    "prefix in the mean": (dict(global_pool="avg", pool_include_prefix=True), "pool_include_prefix"),
    "register tokens": (dict(reg_tokens=2), "register tokens"),
    "layer scale": (dict(init_values=1e-5), "layer scale"),
    "qk norm": (dict(qk_norm=True), "qk_norm"),
    "tanh GELU": (dict(act_layer="gelu_tanh"), "exact GELU"),
    "norm before the blocks": (dict(pre_norm=True), "pre_norm"),
    "no final norm": (dict(final_norm=False), "final_norm=False"),
    "post-norm blocks": (dict(block_fn=ResPostBlock), "ResPostBlock"),
    "CLIP LayerNorm eps": (dict(norm_layer=partial(nn.LayerNorm, eps=1e-5)), "eps=1e-05"),
}


@pytest.mark.parametrize("timm_options,reason", REFUSED.values(), ids=REFUSED.keys())
def test_other_timm_models_are_refused_with_a_reason(timm_options, reason):
    reference = VisionTransformer(**TIMM, **timm_options)
    ours = ViT(**OURS)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError) as error:
        load_timm_weights(ours, reference)
    assert reason in str(error.value) and "\n" not in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())  # nothing copied


def test_a_preactivation_hybrid_is_refused():
    with pytest.raises(ValueError, match="hybrid"):
        load_timm_weights(_hybrid_ours(), _hybrid_timm(_hybrid_backbone(preact=True)))


@pytest.mark.parametrize(
    "timm_options,our_options,reason",
    [
        (dict(), dict(pooling="gap"), "pooling='cls' (model has 'gap')"),
        (dict(class_token=False, global_pool="avg"), dict(pooling="gap"), "pooling='gap_fcnorm' (model has 'gap')"),
        (dict(class_token=False, global_pool="avg", fc_norm=False), dict(pooling="gap_fcnorm"), "pooling='gap'"),
        (dict(), dict(head="mlp_tanh"), "head='linear'"),
        (dict(), dict(pos_encoding="learned_2d"), "pos_encoding='learned_1d'"),
        (dict(), dict(depth=3), "do not fit"),
        (dict(class_token=False, global_pool="map", mlp_ratio=2.0), dict(pooling="map", mlp_dim=128), "do not fit"),
    ],
)
def test_a_model_built_differently_is_refused(timm_options, our_options, reason):
    with pytest.raises(ValueError) as error:
        load_timm_weights(ViT(**{**OURS, **our_options}), VisionTransformer(**TIMM, **timm_options))
    assert reason in str(error.value)


def test_a_state_dict_alone_is_refused():
    with pytest.raises(TypeError, match="not its state_dict"):
        load_timm_weights(ViT(**OURS), VisionTransformer(**TIMM).state_dict())
