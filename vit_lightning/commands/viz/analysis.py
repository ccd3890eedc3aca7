"""The paper's analysis numbers (Figures 6, 7, 10, 11, 14) computed from a ViT and its attention maps.

Pure computations on tensors: nothing here draws or writes files.
"""

from __future__ import annotations

import torch

from vit_lightning.analysis.attention import (  # noqa: F401  (the paper figures' numbers, computed there)
    attention_distance_sum,
    attention_entropy_sum,
    mean_attention_distance,
    patch_distances,
)
from vit_lightning.model.position import Alibi2d, Peg, Relative1d, RelativeBias2d, alibi_slopes


def position_tables(vit) -> list[torch.Tensor] | None:
    """The absolute position embedding of the patch tokens at each injection point, each (N, D); None if none.

    One table for `stem` and `every_layer_shared`, one per block for `every_layer`; relative and conditional
    encodings have no absolute table (see `relative_bias`, `peg_kernels`). Prefix tokens have no grid position: dropped.
    """
    if not hasattr(vit.pos.parts[0], "embedding"):
        return None
    tables = [part.embedding() for part in vit.pos.parts]
    if tables[0] is None:
        return None
    return [t.detach()[vit.pos.positioned:] for t in tables]  # the table's own prefix rows ([class] token) dropped


def cosine_similarity(table: torch.Tensor) -> torch.Tensor:
    """(N, D) embeddings -> (N, N) cosine similarity of every row to every row."""
    unit = table.double() / table.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def relative_bias(vit, images: torch.Tensor | None = None, chunk: int = 8) -> torch.Tensor | None:
    """The attention-logit bias of a relative encoding per layer and head, by 2-D offset (query - key).

    Returns (L, heads, 2H-1, 2W-1), or None for absolute encodings. The learned 2-D bias table (RelativeBias2d) is
    this table, learned directly. The paper's relative encoding (Relative1d) has a bias that depends on the query:
    with `images`, the mean of q.r over their patch queries (the bias the data meets on average); without, the
    query of a token whose normalised content is zero (LN bias -> W_q, plus b_q), the query-independent part.
    ALiBi's (Alibi2d) is fixed and the same in every layer: one row, (1, heads, 2H-1, 2W-1).
    """
    if not vit.pos.relative:
        return None
    if isinstance(vit.pos.parts[0], Alibi2d):
        return alibi_bias(len(vit.pos.parts[0].slopes), vit.pos.grid)[None]
    queries = mean_queries(vit, images, chunk) if images is not None and len(images) else None
    out = []
    for i, (block, part) in enumerate(zip(vit.blocks, vit.pos.parts)):
        if isinstance(part, RelativeBias2d):
            out.append(part.table.detach().double())  # (h, 2H-1, 2W-1)
        elif isinstance(part, Relative1d):
            out.append(_relative_1d_bias(block, part, None if queries is None else queries[i]))
        else:
            raise TypeError(f"no offset map for relative encoding {type(part).__name__}")
    return torch.stack(out)


@torch.no_grad()
def mean_queries(vit, images: torch.Tensor, chunk: int = 8) -> list[torch.Tensor]:
    """Per block, the mean query (heads, hd) its relative encoding receives from the patch tokens of `images`."""
    sums, count = [0.0] * len(vit.pos.parts), 0

    def keep(i):
        def hook(_module, args):
            sums[i] = sums[i] + args[0][:, :, vit.num_prefix:].double().sum(dim=(0, 2))  # (B, h, T, hd) -> (h, hd)
        return hook

    hooks = [part.register_forward_pre_hook(keep(i)) for i, part in enumerate(vit.pos.parts)]
    try:
        for start in range(0, len(images), chunk):
            vit(images[start: start + chunk])
        count = len(images) * vit.pos.grid[0] * vit.pos.grid[1]
    finally:
        for hook in hooks:
            hook.remove()
    return [s / count for s in sums]


def _relative_1d_bias(block, part: Relative1d, query: torch.Tensor | None = None) -> torch.Tensor:
    """(h, 2H-1, 2W-1) logits of `query` (heads, hd; default: the zero-content one) against each offset, in 2-D."""
    attn, (h, w) = block.attn, part.grid
    dim = attn.proj.in_features
    if query is None:
        query = attn.q_norm(attn.qkv(block.norm1.bias.detach())[:dim].view(attn.heads, -1))  # (heads, hd)
    logits = part.offset_logits(query.double()).detach()[:, : 2 * h * w - 1]  # (heads, 2N-1): the patch offsets
    dr = torch.arange(-(h - 1), h)[:, None]
    dc = torch.arange(-(w - 1), w)[None, :]
    raster = dr * w + dc + h * w - 1  # 2-D offset (dr, dc) -> raster offset dr*W + dc, shifted to an index
    return logits[:, raster]


def alibi_bias(heads: int, grid: tuple[int, int]) -> torch.Tensor:
    """(heads, 2H-1, 2W-1) 2-D ALiBi's logit bias by offset (query - key): -slope x Euclidean length of the offset."""
    dr = torch.arange(-(grid[0] - 1), grid[0], dtype=torch.float64)[:, None]
    dc = torch.arange(-(grid[1] - 1), grid[1], dtype=torch.float64)[None, :]
    return -alibi_slopes(heads).double()[:, None, None] * (dr**2 + dc**2).sqrt()


def peg_kernels(vit) -> torch.Tensor | None:
    """(PEGs, D, 3, 3) the depthwise kernels of a PEG encoding (Peg), one set per PEG; None for other encodings."""
    if not isinstance(vit.pos.parts[0], Peg):
        return None
    return torch.stack([part.proj.weight.detach().double()[:, 0] for part in vit.pos.parts])


def attention_rollout(maps: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema (2020): per layer the head-mean attention plus identity, rows renormalised,
    multiplied through the layers (later layers on the left). (B, T, T): row i says how much each
    input token flows into token i at the output."""
    rollout = None
    for probs in maps:  # (B, h, T, T)
        a = probs.double().mean(dim=1)
        a = a + torch.eye(a.shape[-1], dtype=a.dtype)
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    return rollout


def rollout_on_grid(rollout: torch.Tensor, grid: tuple[int, int], num_prefix: int,
                    class_token: bool | None = None) -> torch.Tensor:
    """What the pooled output attends to over the patch grid: (B, H, W).

    With a [class] token (token 0; by default when there are prefix tokens), its row; without one (GAP, MAP),
    the mean of the patch rows, since the pooled vector is built from every patch token's output. Prefix
    tokens (the [class] token, registers) are left out of the columns.
    """
    class_token = bool(num_prefix) if class_token is None else class_token
    rows = rollout[:, :1] if class_token else rollout[:, num_prefix:]  # (B, 1 | N, T)
    return rows[:, :, num_prefix:].mean(dim=1).reshape(-1, *grid)  # (B, N) -> (B, H, W)


def filter_components(weight: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Leading principal components of the patch-embedding filters (Figure 7 left).

    (D, C, P, P) filters -> ((k, C, P, P) unit components, (k,) fraction of variance each explains),
    k = min(count, D, C*P*P). Each component's sign is fixed so its largest entry is positive.
    """
    flat = weight.detach().double().flatten(1)  # (D, C*P*P)
    flat = flat - flat.mean(dim=0, keepdim=True)
    _, s, vt = torch.linalg.svd(flat, full_matrices=False)
    k = min(count, vt.shape[0])
    comps = vt[:k]
    signs = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))  # (k, 1)
    variance = s**2
    return (comps * signs).reshape(k, *weight.shape[1:]), variance[:k] / variance.sum().clamp_min(1e-300)


# Register tokens (Darcet et al. 2024): a few patch tokens of a large, long-trained ViT grow outputs about ten times
# the norm of the others and take the attention; a patch token counts as high-norm above this many medians.
HIGH_NORM = 4.0


def block_outputs(vit, images: torch.Tensor) -> list[torch.Tensor]:
    """The output tokens of every block, each (B, T, D), for `images` (B, C, H, W)."""
    outputs = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach())) for block in vit.blocks]
    try:
        vit(images)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs


def high_norm_counts(outputs: list[torch.Tensor], num_prefix: int, factor: float = HIGH_NORM) -> torch.Tensor:
    """(L,) patch tokens per layer whose output norm exceeds `factor` x the median patch-token norm of its image."""
    counts = []
    for tokens in outputs:  # (B, T, D)
        norms = tokens[:, num_prefix:].double().norm(dim=-1)  # (B, N)
        counts.append((norms > factor * norms.median(dim=1, keepdim=True).values).sum())
    return torch.stack(counts).double()
