"""Load a timm VisionTransformer state dict into our ViT (patch or hybrid stem, learned_1d, cls or gap)."""

from __future__ import annotations

import re

import torch

# timm name pattern -> our name; the first matching rule wins, a name matching none is unexpected
_RULES = [
    (r"^cls_token$", "pool.token"),
    (r"^pos_embed$", "pos.parts.0.table"),
    (r"^patch_embed\.proj\.(weight|bias)$", r"stem.proj.\1"),
    (r"^patch_embed\.backbone\.stem\.conv\.weight$", "stem.root.0.weight"),
    (r"^patch_embed\.backbone\.stem\.norm\.(weight|bias)$", r"stem.root.1.\1"),
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.conv\.weight$", r"stem.stages.\1.\2.downsample.0.weight"),
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.norm\.(weight|bias)$", r"stem.stages.\1.\2.downsample.1.\3"),
    (r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.((conv|norm)\d\.(weight|bias))$", r"stem.stages.\1.\2.\3"),
    (r"^blocks\.(\d+)\.((norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias))$", r"blocks.\1.\2"),
    (r"^(norm|fc_norm)\.(weight|bias)$", r"pool.norm.\2"),
    (r"^head\.(weight|bias)$", r"head.\1"),
]


def _rename(name: str) -> str | None:
    for pattern, target in _RULES:
        if re.match(pattern, name):
            return re.sub(pattern, target, name)
    return None


def load_timm_weights(model, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy timm weights into `model` in place; afterwards both give the same logits.

    The model must have been built with the same sizes, stem, `pos_encoding='learned_1d'`,
    `pos_injection='stem'` and pooling (`cls` for a timm model with a class token, `gap` for one
    with global_pool='avg' and no class token).
    """
    cfg = model.config
    if (cfg.pos_encoding, cfg.pos_injection) != ("learned_1d", "stem"):
        raise ValueError(
            f"timm weights carry a learned 1-D table added at the stem; build the model with "
            f"pos_encoding='learned_1d', pos_injection='stem' (got {cfg.pos_encoding!r}, {cfg.pos_injection!r})"
        )
    timm_pooling = "cls" if "cls_token" in state_dict else "gap"
    if cfg.pooling != timm_pooling:
        raise ValueError(f"the timm weights use pooling {timm_pooling!r} but the model uses {cfg.pooling!r}")
    ours, unexpected = {}, []
    for name, tensor in state_dict.items():
        target = _rename(name)
        if target is None:
            unexpected.append(name)
        else:
            ours[target] = tensor[0] if name == "pos_embed" else tensor  # (1, T, D) -> (T, D)
    if unexpected:
        raise ValueError(f"timm weights have parameters this ViT has no place for: {', '.join(unexpected[:5])}")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(expected[k].shape)}" for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if missing or wrong:
        raise ValueError(f"timm weights do not fit this ViT: missing {missing[:5]}, shape mismatch {wrong[:3]}")
    model.load_state_dict(ours, strict=True)
