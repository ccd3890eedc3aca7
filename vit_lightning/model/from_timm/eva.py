"""Load a timm Eva with 2-D RoPE (NAVER's RoPE-ViT models, `vit_*_patch16_rope*_224`) into our ViT.

Accepted: the pre-norm EvaBlock with a fused qkv, exact-GELU MLP (no SwiGLU, no inner norms), LayerNorm(eps=1e-6),
layer scale or none, a [class] token read by the final LayerNorm (global_pool='token'), no registers, a plain
patch embedding, an optional learned table without a [class] row (`no_embed_class`, NAVER's "ape") and axial
(`RotaryEmbeddingCat` on patch indices, 'xy', interleaved) or mixed (`RotaryEmbeddingMixed`) RoPE without
coordinate augmentation. Anything else (EVA-02's SwiGLU and ref_feat_shape, DINOv3's RoPE, ...) is refused with
the reason.
"""

from __future__ import annotations

import torch
from torch import nn

from vit_lightning.model.from_timm.names import rename


def is_eva(model: nn.Module) -> bool:
    from timm.models.eva import Eva

    return isinstance(model, Eva)


def _rope_kind(eva) -> str:
    """'axial' or 'mixed', or ValueError naming what differs from NAVER's RoPE."""
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingMixed

    rope = eva.rope
    if type(rope) is RotaryEmbeddingMixed and rope.grid_indexing == "xy" and not rope.aug_active:
        return "mixed"
    if (type(rope) is RotaryEmbeddingCat and rope.grid_type == "index" and rope.ref_feat_shape is None
            and not rope.grid_offset and rope.grid_indexing == "xy" and not rope.rotate_half and not rope.aug_active):
        return "axial"
    return f"its RoPE ({type(rope).__name__}) is not NAVER's axial or mixed RoPE on patch indices"


def _unsupported(eva) -> str | None:
    """Why our ViT cannot compute what this timm Eva computes, or None."""
    from timm.layers import Mlp, PatchEmbed
    from timm.models.eva import AttentionRope, EvaBlock

    if eva.rope is None:
        return "it has no RoPE (import RoPE-less ViTs from timm's VisionTransformer)"
    if (kind := _rope_kind(eva)) not in ("axial", "mixed"):
        return kind
    if eva.reg_token is not None or eva.cls_token is None or eva.global_pool != "token":
        return "only a [class] token read by the final LayerNorm (global_pool='token', no registers) fits here"
    if eva.pos_embed is not None and not eva.no_embed_class:
        return "its position table has a [class] row (no_embed_class=False); NAVER's ape tables have none"
    if not (isinstance(eva.norm_pre, nn.Identity) and isinstance(eva.fc_norm, nn.Identity)):
        return "a LayerNorm before the blocks or after the pooling (fc_norm)"
    if type(eva.patch_embed) is not PatchEmbed or not isinstance(eva.patch_embed.norm, nn.Identity):
        return "the patch embedding is not a plain PatchEmbed"
    for i, block in enumerate(eva.blocks):
        attn, mlp = block.attn, block.mlp
        if type(block) is not EvaBlock or type(attn) is not AttentionRope or attn.qkv is None:
            return f"block {i} is {type(block).__name__}/{type(attn).__name__}; only the pre-norm EvaBlock with a fused qkv fits"
        if type(mlp) is not Mlp or not isinstance(mlp.norm, nn.Identity) or not isinstance(attn.norm, nn.Identity):
            return f"block {i}'s MLP is {type(mlp).__name__} or has inner norms (SwiGLU, scale_mlp, scale_attn_inner)"
        if not (isinstance(mlp.act, nn.GELU) and mlp.act.approximate == "none"):
            return f"MLP activation {mlp.act} (this ViT uses exact GELU)"
        if not isinstance(attn.q_norm, (nn.Identity, nn.LayerNorm)):
            return f"qk_norm with {type(attn.q_norm).__name__} (this ViT's qk-norm is LayerNorm)"
    for name, module in eva.named_modules():
        if isinstance(module, nn.LayerNorm) and module.eps != 1e-6:
            return f"{name} is LayerNorm(eps={module.eps}); this ViT uses eps=1e-6"
    if not isinstance(eva.head, nn.Linear):
        return f"its head is {type(eva.head).__name__}, not a Linear"
    return None


def eva_options(eva, variants: dict) -> dict:
    """The ModelConfig options of our twin of a timm RoPE Eva; ValueError (one line) if it has none."""
    if reason := _unsupported(eva):
        raise ValueError(f"cannot load this timm model: {reason}")
    block, embed = eva.blocks[0], eva.patch_embed
    sizes = (len(eva.blocks), eva.embed_dim, block.mlp.fc1.out_features, block.attn.num_heads)
    ape = "learned_1d+" if eva.pos_embed is not None else ""
    return {"arch": "vit", "variant": next((n for n, s in variants.items() if s == sizes), "micro"),
            "depth": sizes[0], "width": sizes[1], "mlp_dim": sizes[2], "heads": sizes[3],
            "patch_size": embed.patch_size[0], "img_size": list(embed.img_size), "in_chans": embed.proj.in_channels,
            "num_classes": eva.num_classes, "pooling": "cls", "head": "linear", "pos_injection": "stem",
            "pos_encoding": f"{ape}rope_{_rope_kind(eva)}", "rope_theta": float(eva.rope.temperature),
            "rope_coords": "patch", "pos_embed_class": not ape,
            "layer_scale": None if block.gamma_1 is None else 1e-5, "qk_norm": not isinstance(block.attn.q_norm, nn.Identity)}


def load_timm_eva(model, eva) -> None:
    """A timm RoPE Eva's weights into our ViT built to match it (see eva_options); ValueError before copying."""
    wanted = eva_options(eva, {})
    cfg = model.config
    keys = ("depth", "width", "heads", "mlp_dim", "patch_size", "pooling", "head", "pos_injection", "pos_encoding",
            "rope_coords", "pos_embed_class", "qk_norm", "reg_tokens")
    differ = [f"{k}={wanted.get(k, 0)!r} (model has {getattr(cfg, k)!r})" for k in keys if wanted.get(k, 0) != getattr(cfg, k)]
    if (wanted["layer_scale"] is None) != (cfg.layer_scale is None):
        differ.append(f"layer_scale={wanted['layer_scale']!r} (model has {cfg.layer_scale!r})")
    # the theta the model was built with (its kind's default when rope_theta is None); mixed: the weights replace it
    if cfg.pos_encoding.endswith("rope_axial") and model.pos.rotations[0].theta != wanted["rope_theta"]:
        differ.append(f"rope_theta={wanted['rope_theta']!r} (model has {cfg.rope_theta!r})")
    if differ:
        raise ValueError(f"build the model to match the timm one: {', '.join(differ)}")
    model.load_state_dict(_translate(model, eva), strict=True)


def _translate(model, eva) -> dict[str, torch.Tensor]:
    """timm's state dict under our names (RoPE's per-block frequencies split by block, our `ref` grids kept)."""
    ours = {k: v for k, v in model.state_dict().items() if k.endswith(".ref")}  # the grid it is built for
    for name, tensor in eva.state_dict().items():
        if name == "pos_embed":
            ours["pos.parts.0.table"] = tensor[0]  # (1, N, D) -> (N, D): patch rows only (no_embed_class)
        elif name == "rope.freqs":  # (2, depth, h, hd/2) -> each block's (2, h, hd/2)
            ours.update({f"pos.rotations.{i}.freqs": tensor[:, i] for i in range(tensor.shape[1])})
        elif target := rename(name, "eva"):
            ours[target] = tensor
        else:
            raise ValueError(f"timm weights have a parameter this ViT has no place for: {name}")
    for key, value in model.state_dict().items():
        if key not in ours and key.endswith(".bias") and key[: -len("bias")] + "weight" in ours:
            ours[key] = torch.zeros_like(value)  # a timm layer without a bias (qkv_bias=False) = a zero bias
    return ours
