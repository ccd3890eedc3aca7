"""Load a timm SwinTransformer into our Swin when ours computes the same function (its family's importer)."""

from __future__ import annotations

import torch
from torch import nn

from vit_lightning.model.from_timm.names import rename


def _unsupported(swin, model) -> str | None:
    """Why our Swin cannot compute what this timm SwinTransformer computes, or None."""
    from timm.models.swin_transformer import SwinTransformerBlock

    if swin.head.global_pool.pool_type != "avg" or not isinstance(swin.head.fc, nn.Linear):
        return f"its head is {swin.head.global_pool.pool_type!r} pooling + {type(swin.head.fc).__name__}; ours is avg + Linear"
    if isinstance(swin.patch_embed.norm, nn.Identity):
        return "no LayerNorm after the patch embedding (patch_norm=False)"
    blocks = [b for layer in swin.layers for b in layer.blocks]
    if len(blocks) != len(model.blocks):
        return f"{len(blocks)} blocks, the model has {len(model.blocks)}"
    for i, (theirs, ours) in enumerate(zip(blocks, model.blocks)):
        if type(theirs) is not SwinTransformerBlock or not isinstance(theirs.mlp.act, nn.GELU) or theirs.mlp.act.approximate != "none":
            return f"block {i} is not a plain SwinTransformerBlock with exact GELU"
        if tuple(theirs.window_size) != (ours.m, ours.m) or tuple(theirs.shift_size) != (ours.s, ours.s):
            return (f"block {i} has window {tuple(theirs.window_size)} shift {tuple(theirs.shift_size)}, the model "
                    f"window {ours.m} shift {ours.s} (set window_size, shift, img_size to match)")
    for name, module in swin.named_modules():
        if isinstance(module, nn.LayerNorm) and (module.eps != 1e-5 or module.weight is None):
            return f"{name} is LayerNorm(eps={module.eps}); Swin's are affine with eps=1e-5"
    return None


def timm_swin_reference(variant: str, img_size: int, num_classes: int, variants: dict) -> nn.Module:
    """timm's SwinTransformer at our Swin's sizes for `variant`: patch 4, window 7, relative bias, no drop path."""
    from timm.models.swin_transformer import SwinTransformer

    width, depths, heads = variants[variant]
    return SwinTransformer(img_size=img_size, patch_size=4, num_classes=num_classes, embed_dim=width,
                           depths=depths, num_heads=heads, window_size=7, drop_path_rate=0.0)


def load_timm_swin(model, swin: nn.Module) -> None:
    """Copy a timm SwinTransformer's weights into our Swin in place; afterwards both give the same logits."""
    from timm.models.swin_transformer import SwinTransformer

    if not isinstance(swin, SwinTransformer):
        raise TypeError(f"expected a timm SwinTransformer for a Swin, got {type(swin).__name__}")
    cfg = model.config
    if cfg.pos_encoding != "relative_bias_2d" or cfg.head != "linear":
        raise ValueError(f"build the model to match the timm one: pos_encoding='relative_bias_2d', head='linear' "
                         f"(model has {cfg.pos_encoding!r}, {cfg.head!r})")
    reason = _unsupported(swin, model)
    if reason:
        raise ValueError(f"cannot load this timm model: {reason}")
    ours, unexpected = {}, []
    for name, tensor in swin.state_dict().items():
        if name.endswith(("relative_position_index", "attn_mask")):
            continue  # buffers both sides derive from the sizes
        target = rename(name, "swin")
        if target is None:
            unexpected.append(name)
        elif name.endswith("relative_position_bias_table"):
            side = int(round(tensor.shape[0] ** 0.5))  # ((2M-1)^2, heads) -> (heads, 2M-1, 2M-1)
            ours[target] = tensor.T.reshape(-1, side, side)
        else:
            ours[target] = tensor
    if unexpected:
        raise ValueError(f"timm weights have parameters this Swin has no place for: {', '.join(unexpected[:5])}")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(expected[k].shape)}"
             for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if missing or wrong:
        raise ValueError(f"timm weights do not fit this Swin: missing {missing[:5]}, shape mismatch {wrong[:3]}")
    model.load_state_dict({k: torch.as_tensor(v) for k, v in ours.items()}, strict=True)
