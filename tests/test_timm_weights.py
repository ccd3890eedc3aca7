"""load_timm_weights: every timm structure it accepts gives timm's logits; every other one is refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from vit_lightning import ViT, load_timm_weights
from vit_lightning.model.build import timm_twin

timm = pytest.importorskip("timm")
from timm.layers import RmsNorm, SwiGLUPacked  # noqa: E402
from timm.models.vision_transformer import ResPostBlock, VisionTransformer, checkpoint_filter_fn  # noqa: E402

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
    "no position for the class token": (dict(no_embed_class=True), dict(pooling="cls", pos_embed_class=False)),
    "no position table": (dict(pos_embed="none"), dict(pooling="cls", pos_encoding="none")),
    "layer scale": (dict(init_values=1e-5), dict(pooling="cls", layer_scale=1e-5)),
    "qk norm": (dict(qk_norm=True), dict(pooling="cls", qk_norm=True)),
    "registers, class token": (dict(reg_tokens=2, no_embed_class=True), dict(reg_tokens=2, pos_embed_class=False)),
    "registers, avg": (dict(reg_tokens=3, class_token=False, global_pool="avg", no_embed_class=True),
                       dict(reg_tokens=3, pooling="gap_fcnorm")),
    "registers, class token + avg": (dict(reg_tokens=1, global_pool="avg", no_embed_class=True),
                                     dict(reg_tokens=1, pooling="gap_fcnorm_cls", pos_embed_class=False)),
    "registers, no position table": (dict(reg_tokens=2, pos_embed="none"), dict(reg_tokens=2, pos_encoding="none")),
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
    "registers with positions": (dict(reg_tokens=2), "no_embed_class=False"),
    "registers in the map pooling": (dict(reg_tokens=2, no_embed_class=True, class_token=False, global_pool="map"),
                                     "attends to the register tokens"),
    "SwiGLU MLP": (dict(mlp_layer=SwiGLUPacked, act_layer=nn.SiLU, mlp_ratio=2.0), "MLP is GluMlp (gated, e.g. SwiGLU)"),
    "RMSNorm": (dict(norm_layer=RmsNorm), "block norms are RmsNorm"),
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


# ---- the checkpoints compared against since 2022 (random weights, no download) ----------------------------------
# Each is timm's own architecture by name, with depth 2 and a narrower width (the same flags: layer scale,
# registers, no_embed_class, pooling), so that a 518 px forward stays a second or two on a CPU.
NAMED = {
    "deit3_small_patch16_224": dict(depth=2),
    "vit_small_patch14_reg4_dinov2": dict(depth=2, embed_dim=96),
    "vit_medium_patch16_reg4_gap_256": dict(depth=2, embed_dim=128),
    "flexivit_small": dict(depth=2, embed_dim=96),
}


def _named(name: str, **options) -> VisionTransformer:
    return _randomise(timm.create_model(name, pretrained=False, num_classes=7, **NAMED[name], **options))


def _ours_for(reference: VisionTransformer) -> ViT:
    return timm_twin(reference)[1].eval()


@pytest.mark.parametrize("name", NAMED)
def test_named_timm_models_give_equal_logits(name):
    reference = _named(name)
    ours = _ours_for(reference)
    side = reference.patch_embed.img_size[0]  # 224, 518, 256, 240: each at its own resolution
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        want = reference(x)
        assert (want[0] - want[1]).abs().max() > 1e-4  # the logits follow the image
        torch.testing.assert_close(ours(x), want, atol=1e-6, rtol=1e-5)


def test_dinov2_with_registers_at_224_px_gives_timm_logits():
    """timm loads the 518 px weights into a 224 px model by resampling the table (bicubic, antialiased)."""
    reference = _named("vit_small_patch14_reg4_dinov2")
    assert reference.patch_embed.img_size == (518, 518) and not reference.dynamic_img_size
    small = _named("vit_small_patch14_reg4_dinov2", img_size=224)
    small.load_state_dict(checkpoint_filter_fn(reference.state_dict(), small))
    dynamic = _named("vit_small_patch14_reg4_dinov2", dynamic_img_size=True)
    dynamic.load_state_dict(reference.state_dict())
    ours = _ours_for(reference)
    ours.resize(224)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), small(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(ours(x), dynamic(x), atol=1e-6, rtol=1e-5)  # resampled at each forward


def test_layer_scale_is_evas_gamma():
    """timm's Eva blocks (the RoPE ViTs' class) scale their branches by gamma_1, gamma_2 as our ls1, ls2 do."""
    from timm.models.eva import EvaBlock

    from vit_lightning.model.layers import Block

    eva = _randomise(EvaBlock(64, 4, qkv_bias=True, init_values=1e-5))
    ours = Block(64, 4, 256, scale=1e-5).eval()
    qkv_bias = torch.cat([eva.attn.q_bias, torch.zeros_like(eva.attn.q_bias), eva.attn.v_bias])  # Eva: no key bias
    state = {"attn.qkv.weight": eva.attn.qkv.weight, "attn.qkv.bias": qkv_bias, "ls1.gamma": eva.gamma_1,
             "ls2.gamma": eva.gamma_2, **{k: v for k, v in eva.state_dict().items()
                                         if k.startswith(("norm1", "norm2", "attn.proj", "mlp.fc"))}}
    ours.load_state_dict(state)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), eva(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,img_size", [*((name, None) for name in NAMED), ("vit_small_patch14_reg4_dinov2", 224)])
def test_init_from_a_timm_file_gives_timm_logits(name, img_size, tmp_path, monkeypatch):
    from vit_lightning.run.transfer import read_source, start_from

    reference = _named(name)
    weights = tmp_path / f"{name}.pth"
    torch.save(reference.state_dict(), weights)
    create = timm.create_model  # timm:NAME builds timm's NAME; here its depth-2 twin, as above
    monkeypatch.setattr(timm, "create_model", lambda n, **kw: create(n, **{**NAMED[name], **kw}))
    source = read_source(f"timm:{name}@{weights}")
    if img_size:  # timm's model at 224 px, the 518 px weights loaded as timm loads them (table resampled)
        small = _named(name, img_size=img_size)
        small.load_state_dict(checkpoint_filter_fn(reference.state_dict(), small))
        reference = small
    side = reference.patch_embed.img_size[0]
    ours = ViT(**{**source.options, "img_size": side}).eval()
    start_from(ours, source)
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-6, rtol=1e-5)
