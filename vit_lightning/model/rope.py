"""2-D rotary position encodings (RoPE, Heo et al. 2024): coordinates, frequencies and the rotation itself.

A head's channels form hd/2 pairs; pair j of the token at (x, y) is turned by the angle x * fx_j + y * fy_j,
as a complex number (channel 2j the real part, 2j+1 the imaginary part) times exp(i * angle). Then the
dot product of a rotated query and key depends on their positions through the offset between them only.
Axial RoPE gives the first hd/4 pairs x-frequencies and the other hd/4 y-frequencies (theta^(-k/(hd/4)));
mixed RoPE learns both components of every pair's frequency, per layer and head, started as NAVER does:
the axial magnitudes turned by one random angle per head.
"""

from __future__ import annotations

import math

import torch

# model.rope_coords: what (x, y) a patch token gets, and so what a larger grid means
COORDS = ("patch", "ref_grid", "normalized")
DEFAULT_THETA = {"axial": 100.0, "mixed": 10.0}  # NAVER's base frequencies


def check_head_dim(head_dim: int) -> None:
    """Both axes rotate pairs of channels, so a head's width must split into 4 equal parts."""
    if head_dim % 4:
        raise ValueError(f"RoPE needs a head width (width / heads) divisible by 4 (x and y each "
                         f"rotate pairs of channels), got width / heads = {head_dim}")


def coordinates(grid: tuple[int, int], ref: tuple[int, int], coords: str) -> torch.Tensor:
    """(N, 2) float64 (x, y) of each patch in raster order.

    patch: column and row index (NAVER); ref_grid: indices rescaled so the grid spans the reference grid's
    extent (EVA-02, timm's ref_feat_shape); normalized: patch centres in [-1, 1] (DINOv3).
    """
    h, w = grid
    ys, xs = torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64)
    if coords == "ref_grid":
        ys, xs = ys * ref[0] / h, xs * ref[1] / w
    elif coords == "normalized":
        ys, xs = (ys + 0.5) / h * 2 - 1, (xs + 0.5) / w * 2 - 1
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([x.flatten(), y.flatten()], dim=1)


def coordinate_scale(coords: str) -> float:
    """Normalized coordinates span 2 units, not a grid's side: DINOv3 turns them by 2 pi per unit."""
    return 2 * math.pi if coords == "normalized" else 1.0


def axial_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """(2, hd/2) x- and y-components of each pair's frequency: x on the first hd/4 pairs, y on the rest."""
    quarter = head_dim // 4
    magnitude = theta ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # (hd/4,)
    zero = torch.zeros_like(magnitude)
    return torch.stack([torch.cat([magnitude, zero]), torch.cat([zero, magnitude])])


def mixed_frequencies(heads: int, head_dim: int, theta: float) -> torch.Tensor:
    """(2, h, hd/2) NAVER's start: per head, the axial magnitudes along a random direction a (first hd/4 pairs)
    and along a + 90 degrees (the rest)."""
    quarter = head_dim // 4
    magnitude = theta ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # (hd/4,)
    a = torch.rand(heads, 1, dtype=torch.float64) * 2 * math.pi  # (h, 1)
    fx = torch.cat([magnitude * torch.cos(a), magnitude * torch.cos(a + math.pi / 2)], dim=1)  # (h, hd/2)
    fy = torch.cat([magnitude * torch.sin(a), magnitude * torch.sin(a + math.pi / 2)], dim=1)
    return torch.stack([fx, fy]).float()


def angles(xy: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """(N, 2) coordinates and (2, ..., hd/2) frequencies -> (..., N, hd/2) angles, in float32 at least."""
    freqs = freqs.float() if freqs.dtype != torch.float64 else freqs
    xy = xy.to(freqs.dtype)
    return xy[:, 0, None] * freqs[0][..., None, :] + xy[:, 1, None] * freqs[1][..., None, :]


def rotate(x: torch.Tensor, theta: torch.Tensor, skip: int) -> torch.Tensor:
    """(B, h, T, hd) tokens with the last N = T - skip turned pairwise by (h|..., N, hd/2) angles; the first `skip`
    (the [class] and register tokens) are left as they are."""
    prefix, patches = x[:, :, :skip], x[:, :, skip:]
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    re, im = patches[..., 0::2], patches[..., 1::2]  # (B, h, N, hd/2) each
    turned = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2)
    return torch.cat([prefix, turned], dim=2)


# A frequency rule for a grid larger than the one trained on, applied at evaluation (eval --rope-scaling): none (plain
# extension: the trained frequencies at the new positions), ntk (NTK-aware: the base theta times s^(d/(d-2)), d the
# rotary channels of an axis) or yarn (YaRN, Peng et al. 2024: per frequency, interpolate by s the ones that turn less
# than ALPHA times over the trained side, keep the ones that turn more than BETA times, ramp between; logits sharpened
# by (0.1 ln s + 1)^2). s: the new grid's side over the trained one, per axis; nothing changes where s <= 1.
SCALINGS = ("none", "ntk", "yarn")
NO_SCALING = SCALINGS[0]  # plain extension: the trained frequencies
YARN_ALPHA, YARN_BETA = 1.0, 32.0  # YaRN's ramp bounds (its LLaMA values), in turns over the trained length


def stretch(grid: tuple[int, int], ref: tuple[int, int]) -> tuple[float, float]:
    """(s_x, s_y): how many times longer the new grid's width and height are than the trained ones (at least 1)."""
    return max(1.0, grid[1] / ref[1]), max(1.0, grid[0] / ref[0])


def scaled_frequencies(freqs: torch.Tensor, grid: tuple[int, int], ref: tuple[int, int], rule: str) -> torch.Tensor:
    """(2, ..., hd/2) frequencies (x and y components, pair j of the axis pairs k = j mod hd/4) under `rule` at
    `grid` for a model trained at `ref`; the same tensor for none or a grid no larger than ref."""
    s = stretch(grid, ref)
    if rule == "none" or s == (1.0, 1.0):
        return freqs
    quarter = freqs.shape[-1] // 2
    k = (torch.arange(freqs.shape[-1], dtype=torch.float64) % quarter).to(freqs.device)  # index within its axis
    out = []
    for component, factor, trained in zip(freqs, s, (ref[1], ref[0])):
        if rule == "ntk":  # theta' = theta s^(q/(q-1)): pair k's frequency times s^(-k/(q-1)), the lowest divided by s
            scale = factor ** (-k / (quarter - 1)) if quarter > 1 else torch.ones_like(k)
            out.append(component * scale.to(component.dtype))
        else:
            turns = trained * component.abs().double() / (2 * math.pi)  # r = L / wavelength
            ramp = ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0, 1)  # gamma: 0 interpolate, 1 keep
            out.append(component * ((1 - ramp) / factor + ramp).to(component.dtype))
    return torch.stack(out)


def yarn_scale(grid: tuple[int, int], ref: tuple[int, int]) -> float:
    """YaRN's factor on queries and keys, sqrt(1/t) = 0.1 ln s + 1 with s the larger of the two stretches."""
    return 0.1 * math.log(max(stretch(grid, ref))) + 1.0
