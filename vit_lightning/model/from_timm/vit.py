"""Load a timm VisionTransformer into our ViT when our backbone can express its structure exactly.

The timm model itself is read, not only its state dict: the pooling, the place of the final
LayerNorm, the activation and the block type decide the logits but leave no trace in the weights.
Accepted: the pre-norm ViT with exact GELU and LayerNorm(eps=1e-6), a patch or BiT hybrid stem, a
learned position table (or none) added at the stem, with or without a row for the [class] token
(`no_embed_class`), [class] token / average / attention pooling as listed in `timm_pooling`, layer
scale (`init_values`), register tokens (`reg_tokens`, without a position), qk-norm, and a linear or
MLP-tanh head (`head = Sequential(Linear, Tanh, Linear)`; timm 1.x has no `representation_size`).
A timm Eva with NAVER's 2-D RoPE goes to eva.py beside this module. Anything else is refused with the reason.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from vit_lightning.model.from_timm.eva import eva_options, is_eva, load_timm_eva
from vit_lightning.model.from_timm.names import rename


def _rename(name: str, norm: str) -> str | None:
    """Our name for a timm parameter; `norm` is the timm module ('norm' or 'fc_norm') that is our pooling norm."""
    if re.match(rf"^{norm}\.(weight|bias)$", name):
        return "pool.norm." + name.rsplit(".", 1)[1]
    return rename(name, "vit")


def _is(module, kind: type) -> bool:
    return isinstance(module, kind)


def timm_pooling(vit) -> tuple[str, str]:
    """(our pooling name, the timm norm module it uses) for a timm VisionTransformer; ValueError if none fits.

    token -> `cls`; avg with norm -> `gap` (LN on every token, then the mean, as the paper); avg with
    fc_norm -> `gap_fcnorm`, or `gap_fcnorm_cls` with a class token; map -> `map`.
    """
    pool, token = vit.global_pool, vit.has_class_token
    norms = [name for name in ("norm", "fc_norm") if not _is(getattr(vit, name), nn.Identity)]
    if len(norms) != 1:
        raise ValueError("no final LayerNorm (final_norm=False); this ViT always has one")
    norm = norms[0]
    if pool == "token":
        return "cls", norm  # LayerNorm is per token: before or after picking the class token is the same
    if pool == "avg" and token and vit.pool_include_prefix:
        raise ValueError("it averages its class token with the patches (pool_include_prefix=True)")
    if pool == "avg" and norm == "norm":
        if token:
            raise ValueError("a class token, global_pool='avg' and fc_norm=False: no pooling here keeps a class token "
                             "and normalises before the mean")
        return "gap", norm
    if pool == "avg":
        return ("gap_fcnorm_cls" if token else "gap_fcnorm"), norm
    if pool == "map" and not token:
        return "map", norm
    if pool == "map":
        raise ValueError("global_pool='map' and a class token: this ViT's map pooling has no class token")
    raise ValueError(f"global_pool={pool!r} has no counterpart here (token, avg and map do)")


def _unsupported(vit) -> str | None:
    """Why our ViT cannot compute what this timm VisionTransformer computes, or None."""
    from timm.layers import Attention, Mlp, PatchEmbed
    from timm.models.vision_transformer import Block

    if getattr(vit, "dist_token", None) is not None:
        return "distilled (DeiT) models have a distillation token and two heads"
    if vit.num_reg_tokens and vit.pos_embed is not None and not vit.no_embed_class:
        return "its register tokens have rows in the position table (no_embed_class=False); here registers have no position"
    if vit.num_reg_tokens and vit.global_pool == "map":
        return "its attention pooling attends to the register tokens; here registers are left out of the pooling"
    if not _is(vit.norm_pre, nn.Identity):
        return "a LayerNorm before the blocks (pre_norm=True)"
    for i, block in enumerate(vit.blocks):
        if type(block) is not Block or type(block.attn) is not Attention:
            kinds = f"{type(block).__name__}/{type(block.attn).__name__}"
            return f"block {i} is {kinds}; only timm's pre-norm Block/Attention match this ViT"
        if type(block.mlp) is not Mlp:
            gated = " (gated, e.g. SwiGLU)" if "Glu" in type(block.mlp).__name__ else ""
            return f"block {i}'s MLP is {type(block.mlp).__name__}{gated}; this ViT's MLP is Linear, GELU, Linear (timm's Mlp)"
        if not (_is(block.attn.q_norm, (nn.Identity, nn.LayerNorm)) and type(block.attn.k_norm) is type(block.attn.q_norm)):
            return f"qk_norm with {type(block.attn.q_norm).__name__} (this ViT's qk-norm is LayerNorm)"
        extras = {"scale_attn_norm": (block.attn.norm,), "scale_mlp_norm": (block.mlp.norm,)}
        for what, modules in extras.items():
            if not all(_is(m, nn.Identity) for m in modules):
                return f"{what} is not part of this ViT"
        if getattr(block.attn, "gate", None) is not None:
            return "gated attention is not part of this ViT"
        act = block.mlp.act
        if not (_is(act, nn.GELU) and act.approximate == "none"):
            return f"MLP activation {act} (this ViT uses exact GELU)"
        if not (_is(block.norm1, nn.LayerNorm) and _is(block.norm2, nn.LayerNorm)):
            return f"block norms are {type(block.norm1).__name__} (this ViT uses LayerNorm)"
    ls = {type(m).__name__ for b in vit.blocks for m in (b.ls1, b.ls2)}
    if len(ls) != 1 or not ls <= {"Identity", "LayerScale"}:
        return f"layer scale of kinds {sorted(ls)}; here every branch has timm's LayerScale or none"
    for name, module in vit.named_modules():
        if _is(module, nn.LayerNorm) and (module.eps != 1e-6 or module.weight is None or module.bias is None):
            return f"{name} is LayerNorm(eps={module.eps}, affine={module.weight is not None}); this ViT uses eps=1e-6, affine"
    pool = vit.attn_pool
    if pool is not None and (type(pool).__name__ != "AttentionPoolLatent" or pool.latent_len != 1 or pool.pos_embed is not None
                             or not _is(pool.q, nn.Linear) or not _is(pool.q_norm, nn.Identity) or pool.mlp is None
                             or not _is(pool.mlp.act, nn.GELU) or pool.mlp.act.approximate != "none"):
        return "the attention pooling is not one probe with a query projection and an exact-GELU MLP"
    embed = vit.patch_embed
    if type(embed).__name__ == "HybridEmbed":
        return _hybrid_unsupported(embed)
    if type(embed) is not PatchEmbed or not _is(embed.norm, nn.Identity) or embed.dynamic_img_pad:
        return "the patch embedding is not a plain PatchEmbed (no norm, no dynamic padding)"
    return None


def _hybrid_unsupported(embed) -> str | None:
    """Why a timm HybridEmbed is not our BiT stem (ResNetV2 v1.5, StdConv 'SAME', GroupNorm(32)), or None."""
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import Bottleneck, ResNetV2

    net = embed.backbone
    if type(net) is not ResNetV2 or not _is(net.norm, nn.Identity) or type(net.stem.pool).__name__ != "MaxPool2dSame":
        return "the hybrid backbone is not a ResNetV2 with a 'same' stem and no final norm (preact=False, stem_type='same')"
    for name, module in net.named_modules():
        if _is(module, nn.Conv2d) and (type(module) is not StdConv2dSame or module.eps != 1e-8):
            return f"hybrid conv {name} is not StdConv2dSame(eps=1e-8)"
        if _is(module, nn.GroupNorm) and (module.num_groups != 32 or module.eps != 1e-5):
            return f"hybrid norm {name} is not GroupNorm(32, eps=1e-5)"
    if any(type(block) is not Bottleneck for stage in net.stages for block in stage.blocks):
        return "hybrid blocks are not timm's non-pre-activation Bottleneck"
    return None


def _head(vit) -> str:
    head = vit.head
    if _is(head, nn.Linear):
        return "linear"
    if (_is(head, nn.Sequential) and len(head) == 3 and _is(head[0], nn.Linear) and _is(head[1], nn.Tanh)
            and _is(head[2], nn.Linear) and head[0].in_features == head[0].out_features):
        return "mlp_tanh"
    raise ValueError(f"timm head {type(head).__name__} is neither a Linear nor Sequential(Linear(D, D), Tanh, Linear)")


def load_timm_vit(model, timm_model: nn.Module) -> None:
    """The ViT family's importer: a timm VisionTransformer into our ViT (see build.load_timm_weights)."""
    from timm.models.vision_transformer import VisionTransformer

    if is_eva(timm_model):
        return load_timm_eva(model, timm_model)
    if not isinstance(timm_model, VisionTransformer):
        raise TypeError(f"expected a timm VisionTransformer or RoPE Eva for a ViT, got {type(timm_model).__name__}")
    reason = _unsupported(timm_model)
    if reason:
        raise ValueError(f"cannot load this timm model: {reason}")
    try:
        pooling, norm = timm_pooling(timm_model)
    except ValueError as error:
        raise ValueError(f"cannot load this timm model: {error}") from None
    cfg = model.config
    wanted = {"pooling": pooling, "pos_injection": "stem", "head": _head(timm_model), **timm_parts(timm_model)}
    differ = [f"{k}={v!r} (model has {getattr(cfg, k)!r})" for k, v in wanted.items() if _differs(k, v, getattr(cfg, k))]
    if differ:
        raise ValueError(f"build the model to match the timm one: {', '.join(differ)}")
    model.load_state_dict(_translate(model, timm_model, norm), strict=True)


def _differs(key: str, want, have) -> bool:
    """Whether our option `key` fails timm's value; any layer_scale value fits (the weights replace the initial one)."""
    return (want is None) != (have is None) if key == "layer_scale" else want != have


def timm_parts(vit) -> dict:
    """The ModelConfig options that a timm VisionTransformer's structure fixes beyond its sizes and pooling.

    `layer_scale` is timm's `init_values` (only whether it is set shows in the logits: the weights replace it).
    """
    block = vit.blocks[0]
    return {"pos_encoding": "none" if vit.pos_embed is None else "learned_1d",
            "stem": "hybrid" if type(vit.patch_embed).__name__ == "HybridEmbed" else "patch",
            "layer_scale": None if _is(block.ls1, nn.Identity) else float(getattr(block.ls1, "init_values", 1e-5)),
            "reg_tokens": vit.num_reg_tokens, "qk_norm": not _is(block.attn.q_norm, nn.Identity),
            "pos_embed_class": not (vit.no_embed_class and vit.has_class_token and vit.pos_embed is not None)}


def _translate(model, timm_model: nn.Module, norm: str) -> dict[str, torch.Tensor]:
    """timm's state dict under our names, checked against the model's shapes."""
    ours, unexpected = {}, []
    for name, tensor in timm_model.state_dict().items():
        target = _rename(name, norm)
        if target is None:
            unexpected.append(name)
        elif name == "pos_embed":
            ours[target] = tensor[0]  # (1, T, D) -> (T, D): the same rows (pos_embed_class says whether the first is the [class] token's)
        else:
            ours[target] = tensor
    if unexpected:
        raise ValueError(f"timm weights have parameters this ViT has no place for: {', '.join(unexpected[:5])}")
    expected = model.state_dict()
    for key in set(expected) - set(ours):
        if key.endswith(".bias") and key[: -len("bias")] + "weight" in ours:
            ours[key] = torch.zeros_like(expected[key])  # a timm layer without a bias (qkv_bias=False) = a zero bias
    missing = sorted(set(expected) - set(ours))
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(expected[k].shape)}"
             for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if missing or wrong:
        raise ValueError(f"timm weights do not fit this ViT: missing {missing[:5]}, shape mismatch {wrong[:3]}")
    return ours


def timm_vit_options(vit, variants: dict) -> dict | None:
    """The ModelConfig options that build our twin of a timm VisionTransformer (patch stem only); None: not a ViT."""
    from timm.models.vision_transformer import VisionTransformer

    if is_eva(vit):
        return eva_options(vit, variants)
    if not isinstance(vit, VisionTransformer):
        return None
    embed, block = vit.patch_embed, vit.blocks[0]
    if type(embed).__name__ != "PatchEmbed":
        raise ValueError(f"only patch-stem timm ViTs start a run here, not {type(embed).__name__}")
    sizes = (len(vit.blocks), vit.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads)
    variant = next((name for name, size in variants.items() if size == sizes), "micro")
    depth, width, mlp_dim, heads = sizes
    return {"arch": "vit", "variant": variant, "depth": depth, "width": width, "mlp_dim": mlp_dim, "heads": heads,
            "patch_size": embed.patch_size[0], "img_size": list(embed.img_size), "in_chans": embed.proj.in_channels,
            "num_classes": vit.num_classes, "pooling": timm_pooling(vit)[0], "head": _head(vit), "pos_injection": "stem",
            **timm_parts(vit)}
