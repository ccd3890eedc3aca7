"""Attention read-outs of a trained model: how far (in patches or pixels) and how spread (entropy) its attention is.

The paper's mean attention distance (Figure 7 right, Figure 11) and the attention entropy, from attention maps; the
figures (viz/) and `vit-ablate eval` (read-outs at every canvas) both compute them here.
"""

from __future__ import annotations

import torch

ENTROPY, DISTANCE = "attn/entropy", "attn/distance"  # eval's read-out fields: mean over blocks, and per block


def patch_distances(grid: tuple[int, int], stride: float) -> torch.Tensor:
    """(N, N) Euclidean distance in input pixels between the centres of every pair of patches."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1).double() * stride  # (N, 2)
    return torch.cdist(centres, centres)


def attention_distance_sum(maps: list[torch.Tensor], grid: tuple[int, int], stride: float,
                           num_prefix: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Per layer and head, the attention-weighted query-key distance summed over images and query patches.

    Only patch-to-patch attention carries a distance: attention to prefix tokens is dropped and each
    query's remaining weights are renormalised. Divide by (images x patches) for the mean: (L, heads).
    """
    dist = patch_distances(grid, stride).to(dtype)  # (N, N)
    out = []
    for probs in maps:  # (B, h, T, T)
        patch = probs.to(dtype)[..., num_prefix:, num_prefix:]  # (B, h, N, N)
        patch = patch / patch.sum(dim=-1, keepdim=True)
        out.append((patch * dist).sum(dim=(-1, -2, 0)).double())  # (h,)
    return torch.stack(out)


def mean_attention_distance(maps: list[torch.Tensor], grid: tuple[int, int], stride: float,
                            num_prefix: int) -> torch.Tensor:
    """(L, heads) mean attention distance in input pixels (the paper's Figure 7 right / Figure 11)."""
    images, n = maps[0].shape[0], grid[0] * grid[1]
    return attention_distance_sum(maps, grid, stride, num_prefix) / (images * n)


def attention_entropy_sum(maps: list[torch.Tensor], num_prefix: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(L,) entropy (nats) of each patch query's attention over every token, mean over heads, summed over
    images and queries; divide by (images x patches) for the mean. Low: attention on a few tokens."""
    out = []
    for probs in maps:  # (B, h, T, T)
        p = probs.to(dtype)[:, :, num_prefix:]  # (B, h, N, T) rows of the patch queries
        out.append(torch.special.entr(p).sum(-1).mean(1).double().sum())  # -p log p, 0 where p = 0
    return torch.stack(out)


@torch.no_grad()
def readouts(model, loader, images: int, grid: tuple[int, int], chunk: int = 8) -> dict[str, float] | None:
    """Per block the mean attention entropy (nats, patch queries over every token) and mean attention distance (in
    patches, i.e. tokens) over the first `images` images of a loader, `chunk` at a time; None when the maps are not
    (B, h, prefix + N, prefix + N) on this grid (attention in windows). Fields ENTROPY and DISTANCE (block means),
    `<field>/block<i>`, `attn/images` and `attn/tokens` (T, prefix tokens included)."""
    device, n = next(model.parameters()).device, grid[0] * grid[1]
    was_training, seen, entropy, distance, tokens = model.training, 0, None, None, 0
    model.eval()
    for x, _ in loader:
        for part in x[: images - seen].split(chunk):
            maps = model.attention_maps(part.to(device))  # L x (b, h, T, T)
            tokens, prefix = maps[0].shape[-1], maps[0].shape[-1] - n
            if prefix < 0 or maps[0].shape[-2] != maps[0].shape[-1]:
                model.train(was_training)
                return None
            # float32 here: the means of thousands of queries, not one figure's per-head numbers
            e = attention_entropy_sum(maps, prefix, torch.float32)
            d = attention_distance_sum(maps, grid, 1.0, prefix, torch.float32).mean(1)
            entropy, distance = (e, d) if entropy is None else (entropy + e, distance + d)
            seen += len(part)
        if seen >= images:
            break
    model.train(was_training)
    if not seen:
        return None
    out: dict[str, float] = {"attn/images": seen, "attn/tokens": tokens}
    for field, total in ((ENTROPY, entropy), (DISTANCE, distance)):
        per_block = (total / (seen * n)).tolist()
        out[field] = sum(per_block) / len(per_block)
        out.update({f"{field}/block{i}": v for i, v in enumerate(per_block)})
    return out
