"""Attention biases on the 2-D patch grid from papers after the ViT's: LookHere's directed masks and FIRE.

Both are relative encodings (added to every block's attention logits, see position.Encoding) that are functions of
the patch coordinates, so a new grid rebuilds them by the same rule and nothing is interpolated. Neither gives the
[class] or register tokens a place: their row and column of the bias are zero (unbiased), as LookHere's code does.
Importing this module adds them to position.ENCODINGS.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vit_lightning.model.position import ENCODINGS, Encoding

# LookHere (Fuller et al., NeurIPS 2024): head h looks along direction DIRECTIONS[fov][h mod len] (degrees, 0 = right,
# 90 = up) and sees the keys whose offset from the query lies within fov/2 of it (the query itself always); a seen
# key at distance d (patches) costs slope_layer * slope_head * d logits, an unseen one -inf. 180 and 90 degrees: the
# four sides (halves, and the triangles between the diagonals); 45 degrees: the eight octants, ordered so that the
# first four heads look four ways (LookHere's eighths).
DIRECTIONS = {180: (0.0, 90.0, 180.0, 270.0), 90: (0.0, 90.0, 180.0, 270.0),
              45: (22.5, 202.5, 112.5, 292.5, 67.5, 247.5, 157.5, 337.5)}
# The per-layer slopes fall linearly with depth from the first block's to the last's (the paper's ramp; these ends
# are ours), so early blocks look near and late blocks far; head slopes halve every four heads: 1/2, 1/4, ...
LAYER_SLOPES = (1.5, 0.5)


def head_slopes(heads: int) -> torch.Tensor:
    """(heads,) LookHere's head slopes: 2^-(1 + h // 4), one value for each group of four heads."""
    return torch.tensor([2.0 ** -(1 + h // 4) for h in range(heads)], dtype=torch.float64)


def layer_slope(layer: int, depth: int) -> float:
    """Block `layer`'s slope of `depth` blocks: LAYER_SLOPES[0] at the first, LAYER_SLOPES[1] at the last."""
    first, last = LAYER_SLOPES
    return first if depth == 1 else first + (last - first) * layer / (depth - 1)


def grid_offsets(grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, N) float64 dx and dy of key j from query i (raster order), dy counted upwards (a key above: dy > 0)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    rows, cols = rows.flatten().double(), cols.flatten().double()
    return cols[None, :] - cols[:, None], rows[:, None] - rows[None, :]


def lookhere_bias(grid: tuple[int, int], fov: int, heads: int, slope: float) -> torch.Tensor:
    """(heads, N, N) float64: -slope * head_slope * distance where head h sees the key, -inf where it does not."""
    dx, dy = grid_offsets(grid)
    distance, angle = (dx**2 + dy**2).sqrt(), torch.rad2deg(torch.atan2(dy, dx))
    directions = DIRECTIONS[fov]
    out = []
    for h, rate in enumerate(head_slopes(heads)):
        turn = (angle - directions[h % len(directions)] + 180.0) % 360.0 - 180.0  # signed, in [-180, 180)
        seen = (turn.abs() <= fov / 2 + 1e-9) | (distance == 0)
        out.append(torch.where(seen, -slope * rate * distance, -math.inf))
    return torch.stack(out)


class LookHere(Encoding):
    """LookHere: each head attends within a field of view `fov` along its direction, with a distance penalty whose
    slope is set per layer and head (DIRECTIONS, LAYER_SLOPES); nothing is learned, a new grid rebuilds the bias."""

    relative, injections, layered = True, ("stem",), True  # acts inside every attention layer already
    fov = 180
    on_resize = "nothing resampled: the same fields of view and slopes rebuilt on the new grid (longer distances)"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int, layer: int = 0, depth: int = 1):
        super().__init__()
        self.heads, self.num_prefix, self.slope = heads, num_prefix, layer_slope(layer, depth)
        self.resample(grid)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, hd) queries (unused) -> (1, h, T, T) additive logits (prefix rows and columns zero)."""
        return self.bias[None].to(q.dtype)

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid, p = tuple(grid), self.num_prefix
        bias = F.pad(lookhere_bias(self.grid, self.fov, self.heads, self.slope), (p, 0, p, 0))  # (h, T, T)
        self.register_buffer("bias", bias.float(), persistent=False)


class LookHere90(LookHere):
    """LookHere with 90-degree fields of view (LH-90)."""

    fov = 90


class LookHere45(LookHere):
    """LookHere with 45-degree fields of view (LH-45)."""

    fov = 45


# FIRE (Li et al., ICLR 2024): bias(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), f a learned MLP,
# c and L learned. 1-D and causal there: i - j >= 0 and i, the query's position, is its distance to the farthest key.
# On the 2-D grid (our adaptation, per axis as 2-D ALiBi and RoPE split the axes): for each axis the signed
# u = sign(d) psi(|d|) / psi(max(L, reach)), d the key's offset from the query on that axis and reach the query's
# distance to the farthest patch on it (its bidirectional counterpart of i); f: (u_x, u_y) -> one bias per head.
FIRE_WIDTH = 32  # the MLP's hidden width, FIRE's
FIRE_C = 0.1  # c's start, FIRE's


def fire_inputs(grid: tuple[int, int], c: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """(N, N, 2) FIRE's progressively interpolated (u_x, u_y) of key j from query i, each in [-1, 1]."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    out = []
    for coord, side in ((cols.flatten(), grid[1]), (rows.flatten(), grid[0])):
        coord = coord.to(c)
        d = coord[None, :] - coord[:, None]  # (N, N) key minus query
        reach = torch.maximum(coord, side - 1 - coord)  # (N,) the query's farthest patch on this axis
        norm = torch.log(c.abs() * torch.maximum(threshold.abs(), reach) + 1).clamp_min(1e-6)  # psi(max(L, reach))
        out.append(d.sign() * torch.log(c.abs() * d.abs() + 1) / norm[:, None])
    return torch.stack(out, dim=-1)


class Fire2d(Encoding):
    """FIRE on the 2-D grid (see fire_inputs): a learned MLP of the progressively interpolated offsets, per block.

    L starts at the training grid's longest reach (its side - 1): on that grid every query then divides by psi(L), and
    on a larger one a query far from the border divides by its own longer reach (FIRE's interpolation)."""

    relative, injections = True, ("stem",)  # acts inside every attention layer already
    on_resize = "nothing resampled: the same learned function of the new grid's interpolated offsets"

    def __init__(self, dim: int, heads: int, grid: tuple[int, int], num_prefix: int):
        super().__init__()
        self.num_prefix, self.grid = num_prefix, tuple(grid)
        self.mlp = nn.Sequential(nn.Linear(2, FIRE_WIDTH), nn.ReLU(), nn.Linear(FIRE_WIDTH, heads))
        self.c = nn.Parameter(torch.tensor(FIRE_C))
        self.threshold = nn.Parameter(torch.tensor(float(max(max(grid) - 1, 1))))  # L

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, hd) queries (unused) -> (1, h, T, T) additive logits (prefix rows and columns zero)."""
        p = self.num_prefix
        bias = self.mlp(fire_inputs(self.grid, self.c, self.threshold)).permute(2, 0, 1)  # (h, N, N)
        return F.pad(bias, (p, 0, p, 0))[None].to(q.dtype)

    def resample(self, grid: tuple[int, int], mode: str = "bicubic") -> None:
        self.grid = tuple(grid)


ENCODINGS.update({"lookhere_180": LookHere, "lookhere_90": LookHere90, "lookhere_45": LookHere45, "fire_2d": Fire2d})
