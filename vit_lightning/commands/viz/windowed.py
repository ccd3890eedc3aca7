"""Figures of a family that attends within windows and merges tokens between stages: relative bias per stage,
block and head; mean attention distance per stage.

Token-to-token rollout through every layer has no meaning there, and the family's note says so; the
patch-embedding filters are pixels and are drawn as the shared figures draw them. What the figures say of the run
(their title, their notes) comes from its family (Family.describe, Family.figure_notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vit_lightning.commands.viz import analysis
from vit_lightning.commands.viz.figures import (
    Panel,
    distance_figure,
    panels_figure,
    similarity_mosaic,
    write_csv,
    write_note,
)
from vit_lightning.model.family import family_of


@dataclass
class WindowedNumbers:
    """Everything a windowed run's figures show; one entry per block, in depth order."""

    title: str
    stem_grid: tuple[int, int]
    stride: float  # input pixels per token of stage 1
    stages: list[int]  # the stage (1-based) of each block
    windows: list[int]  # each block's window side m
    bias: list[np.ndarray] | None  # per block (heads, 2m-1, 2m-1); None without a relative bias
    similarity: np.ndarray | None  # (N, N) cosine of the absolute table; None without one
    components: tuple[np.ndarray, np.ndarray] | None
    distance: list[np.ndarray] | None = None  # per block (heads,) mean in-window attention distance in pixels
    encoding: str = ""  # the run's model.pos_encoding
    figure_notes: dict = field(default_factory=dict)  # figure stem -> why it is left out (the family's figure_notes)


def window_distance(probs: torch.Tensor, m: int, stride: float) -> torch.Tensor:
    """(B * windows, h, m*m, m*m) attention -> (h,) attention-weighted query-key distance in pixels, summed."""
    dist = analysis.patch_distances((m, m), stride)  # (m*m, m*m)
    return (probs.double() * dist).sum(dim=(-1, -2, 0))


@torch.no_grad()
def compute_numbers(run, chunk: int = 8) -> WindowedNumbers:
    """The numbers behind every figure of a windowed run."""
    model = run.vit
    blocks = [(i + 1, block) for i, stage in enumerate(model.stages) for block in stage.blocks]
    relative = blocks[0][1].bias.relative is not None
    bias = [b.bias.relative.table.detach().double().numpy() for _, b in blocks] if relative else None
    similarity = None
    if model.pos is not None:
        similarity = analysis.cosine_similarity(model.pos.embedding().detach()).numpy()
    comps, ratios = analysis.filter_components(model.stem.proj.weight, 28)
    c, family = model.config, family_of(model)
    numbers = WindowedNumbers(family.describe(c), tuple(model.stem.grid_for(c.img_hw)), float(c.patch_size),
                              [s for s, _ in blocks], [b.m for _, b in blocks], bias, similarity,
                              (comps.numpy(), ratios.numpy()), encoding=c.pos_encoding,
                              figure_notes=dict(family.figure_notes))
    if run.images is not None and len(run.images):
        totals, queries = None, None
        for start in range(0, len(run.images), chunk):
            maps = model.attention_maps(run.images[start: start + chunk])  # per block (b * windows, h, m*m, m*m)
            part = [window_distance(p, m, numbers.stride * 2 ** (s - 1))
                    for p, m, s in zip(maps, numbers.windows, numbers.stages)]
            count = [p.shape[0] * p.shape[-1] for p in maps]  # queries (padding tokens included) in this chunk
            totals = part if totals is None else [t + p for t, p in zip(totals, part)]
            queries = count if queries is None else [q + n for q, n in zip(queries, count)]
        numbers.distance = [(t / q).numpy() for t, q in zip(totals, queries)]
    return numbers


def draw(numbers: WindowedNumbers, out: Path, draw_components) -> list[Path]:
    """Write every figure that applies with its CSV into out, and a note for each one that does not."""
    out, paths = Path(out), []
    if numbers.bias is not None:
        paths += _draw_bias(numbers, out)
    else:
        paths.append(write_note(out / "pos_bias.txt", f"pos_encoding={numbers.encoding}: no relative position bias "
                                "to draw"))
    if numbers.similarity is not None:
        mosaic = similarity_mosaic(numbers.similarity, numbers.stem_grid)
        paths.append(panels_figure(out / "pos_similarity.png", [Panel("patch positions", mosaic, -1.0, 1.0,
                                   "cosine similarity")], f"Position embedding similarity\n{numbers.title}", 1))
    else:
        paths.append(write_note(out / "pos_similarity.txt", numbers.figure_notes["pos_similarity"]))
    paths += draw_components(numbers, out)
    paths.append(write_note(out / "rollout.txt", numbers.figure_notes["rollout"]))
    if numbers.distance is not None:
        paths += _draw_distance(numbers, out)
    return paths


def _draw_bias(numbers: WindowedNumbers, out: Path) -> list[Path]:
    heads = max(b.shape[0] for b in numbers.bias)
    lim = max(float(np.abs(b).max()) for b in numbers.bias) or 1.0
    panels, rows = [], []
    for layer, (stage, table) in enumerate(zip(numbers.stages, numbers.bias)):
        m = (table.shape[-1] + 1) // 2
        extent = (-(m - 1) - 0.5, (m - 1) + 0.5, (m - 1) + 0.5, -(m - 1) - 0.5)  # column offset x, row offset y
        for h in range(heads):
            image = table[h] if h < table.shape[0] else None
            panels.append(Panel(f"stage {stage}, block {layer + 1}, head {h + 1}", image, -lim, lim, "logit bias",
                                extent))
        rows += [(stage, layer + 1, h + 1, r - (m - 1), c - (m - 1), float(table[h, r, c]))
                 for h in range(table.shape[0]) for r in range(2 * m - 1) for c in range(2 * m - 1)]
    return [panels_figure(out / "pos_bias.png", panels, f"Relative position bias by offset (query - key) in "
                          f"windows\n{numbers.title}", columns=heads, cmap="RdBu_r"),
            write_csv(out / "pos_bias.csv", ["stage", "block", "head", "d_row", "d_col", "bias"], rows)]


def _draw_distance(numbers: WindowedNumbers, out: Path) -> list[Path]:
    depth, series = len(numbers.stages), []
    for stage in sorted(set(numbers.stages)):  # one marker per stage, at the blocks' depth
        mine = [i for i, s in enumerate(numbers.stages) if s == stage]
        dist = np.full((depth, len(numbers.distance[mine[0]])), np.nan)
        for i in mine:
            dist[i] = numbers.distance[i]
        series.append((f"stage {stage}", dist))
    reach = max(numbers.stride * 2 ** (s - 1) * (m - 1) * 2 ** 0.5 for s, m in zip(numbers.stages, numbers.windows))
    rows = [(s, i + 1, h + 1, float(d)) for i, (s, dist) in enumerate(zip(numbers.stages, numbers.distance))
            for h, d in enumerate(dist)]
    return [distance_figure(out / "attention_distance.png", series, reach,
                            f"Mean attention distance within windows\n{numbers.title}"),
            write_csv(out / "attention_distance.csv", ["stage", "block", "head", "distance_px"], rows)]
