"""Drawing the analysis figures as byte-reproducible PNGs (Agg, fixed sizes, no metadata) and their CSVs."""

from __future__ import annotations

import csv
import io
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib.style
import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vit_lightning.core.files import write_atomic
from vit_lightning.core.plotstyle import STYLE, save_png

PANEL_INCHES = 2.1  # side of one heat-map panel
MARKERS = "osD^v<>"


class Panel(NamedTuple):
    """One heat map: a 2-D array (None: nothing to draw, `note` says why) on a fixed colour range."""

    title: str
    image: np.ndarray | None
    vmin: float
    vmax: float
    label: str  # the colour bar's label
    extent: tuple[float, float, float, float] | None = None  # axis coordinates (None: no ticks)
    note: str = "nothing to draw"


def suptitle(fig: Figure, title: str, fontsize: float = 9) -> None:
    """The figure's title, wrapped to its width so that a long one is not cut off at the edges."""
    chars = max(20, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))  # an average glyph is about 0.55 em wide
    fig.suptitle(textwrap.fill(title, chars), fontsize=fontsize)


def similarity_mosaic(sim: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """(N, N) values -> one image tiling query (r, c)'s row as an H x W map at tile (r, c), NaN gaps between."""
    h, w = grid
    mosaic = np.full((h * (h + 1) - 1, w * (w + 1) - 1), np.nan)
    for r in range(h):
        for c in range(w):
            mosaic[r * (h + 1): r * (h + 1) + h, c * (w + 1): c * (w + 1) + w] = sim[r * w + c].reshape(h, w)
    return mosaic


def write_csv(path: Path, header: Sequence[str], rows) -> Path:
    """Rows as CSV with floats to 6 significant digits (stable text across machines)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
    write_atomic(Path(path), buf.getvalue().encode())
    return Path(path)


def write_note(path: Path, text: str) -> Path:
    write_atomic(Path(path), (text + "\n").encode())
    return Path(path)


def _context():
    return rc_context({**STYLE, "axes.grid": False})


def panels_figure(path: Path, panels: list[Panel], title: str, columns: int, cmap: str = "viridis") -> Path:
    """Heat maps in a grid; one shared colour bar when every panel has the same range, else one each."""
    rows = -(-len(panels) // columns)
    drawn = [p for p in panels if p.image is not None]
    shared = len({(p.vmin, p.vmax, p.label) for p in drawn}) == 1
    with matplotlib.style.context("default"), _context():
        size = (max(4.0, PANEL_INCHES * columns + 1.0), PANEL_INCHES * rows + 0.8)
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False)
        for ax in axes.flat:
            ax.set_axis_off()
        for ax, panel in zip(axes.flat, panels):
            ax.set_title(panel.title, fontsize=8)
            if panel.image is None:
                ax.text(0.5, 0.5, panel.note, ha="center", va="center", fontsize=8, transform=ax.transAxes)
                continue
            image = ax.imshow(panel.image, cmap=cmap, vmin=panel.vmin, vmax=panel.vmax, extent=panel.extent,
                              interpolation="nearest")
            if panel.extent is not None:  # offsets on the axes: whole patches
                ax.set_axis_on()
                ax.tick_params(labelsize=7)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            if not shared:
                fig.colorbar(image, ax=ax, shrink=0.8).set_label(panel.label, fontsize=7)
        if shared:
            fig.colorbar(image, ax=axes, shrink=0.8).set_label(drawn[0].label)
        suptitle(fig, title)
        return save_png(fig, path)


def distance_figure(path: Path, series: list[tuple[str, np.ndarray]], max_px: float, title: str) -> Path:
    """Mean attention distance of every head (dots) against depth, one marker per series."""
    with matplotlib.style.context("default"), rc_context(STYLE):
        fig = Figure(figsize=(5.0, 3.5))
        ax = fig.add_subplot()
        width = 0.5 / max(1, len(series))  # spread the series side by side within a layer
        for i, (label, dist) in enumerate(series):  # dist: (L, heads)
            layers, heads = dist.shape
            x = np.repeat(np.arange(1, layers + 1), heads) + (i - (len(series) - 1) / 2) * width
            ax.scatter(x, dist.reshape(-1), s=14, marker=MARKERS[i % len(MARKERS)], label=label, alpha=0.8)
        ax.set_xticks(range(1, max(d.shape[0] for _, d in series) + 1))
        ax.set_ylim(0, max_px * 1.05)
        ax.set(xlabel="network depth (layer)", ylabel="mean attention distance (pixels)", title=title)
        if len(series) > 1:
            ax.legend(loc="lower right")
        fig.tight_layout()
        return save_png(fig, path)


def _display(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(C, H, W) normalised image -> something imshow draws: min-max scaled, grey for one channel."""
    lo, hi = image.min(), image.max()
    image = (image - lo) / (hi - lo) if hi > lo else np.zeros_like(image)
    if image.shape[0] == 1:
        return image[0], "gray"
    return image[:3].transpose(1, 2, 0), None


def rollout_figure(path: Path, images: np.ndarray, maps: np.ndarray, stride: float, title: str) -> Path:
    """Each image above itself overlaid with its rollout map (scaled to its maximum), (k, C, H, W) and (k, h, w)."""
    k = len(images)
    with matplotlib.style.context("default"), _context():
        fig = Figure(figsize=(1.6 * k + 0.4, 3.6), layout="constrained")
        axes = fig.subplots(2, k, squeeze=False)
        for i in range(k):
            shown, cmap = _display(images[i])
            gh, gw = maps[i].shape
            extent = (-0.5, gw * stride - 0.5, gh * stride - 0.5, -0.5)  # the map covers the token grid's pixels
            for ax in axes[:, i]:
                ax.imshow(shown, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
                ax.set_axis_off()
            peak = maps[i].max()
            axes[1, i].imshow(maps[i] / peak if peak > 0 else maps[i], cmap="inferno", vmin=0, vmax=1,
                              alpha=0.6, extent=extent, interpolation="bilinear")
            axes[1, i].set_xlim(-0.5, images.shape[-1] - 0.5)
            axes[1, i].set_ylim(images.shape[-2] - 0.5, -0.5)
        suptitle(fig, title)
        return save_png(fig, path)


def components_figure(path: Path, comps: np.ndarray, ratios: np.ndarray, title: str, columns: int = 7) -> Path:
    """Principal components of the patch filters as small images, each min-max scaled (k, C, P, P)."""
    k = len(comps)
    rows = -(-k // columns)
    with matplotlib.style.context("default"), _context():
        fig = Figure(figsize=(1.0 * columns + 0.4, 1.1 * rows + 0.6), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False)
        for ax in axes.flat:
            ax.set_axis_off()
        for i, ax in enumerate(axes.flat[:k]):
            shown, cmap = _display(comps[i])
            ax.imshow(shown, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(f"{i + 1}: {100 * ratios[i]:.1f}%", fontsize=7)
        suptitle(fig, title)
        return save_png(fig, path)
