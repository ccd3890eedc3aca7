"""Figures as deterministic PNGs: matplotlib defaults + fixed font and size, no metadata, no pyplot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.style
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from vit_lightning.core.plotstyle import STYLE, save_png

# (label, x values, y values, y error or None, line style)
Series = tuple[str, Sequence[float], Sequence[float], Sequence[float] | None, str]


def line_plot(path: Path, series: list[Series], xlabel: str, ylabel: str, title: str,
              logx: bool = False, annotate: dict[str, list[str]] | None = None, integer_x: bool = False) -> None:
    """One line per series (with error bars when given) saved as a PNG at path."""
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        fig = Figure()
        ax = fig.add_subplot()
        for label, x, y, err, style in series:
            ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label)
            for xi, yi, text in zip(x, y, (annotate or {}).get(label, [])):
                ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(4, 4))
        xs = sorted({float(v) for _, x, *_ in series for v in x})
        if logx:
            ax.set_xscale("log")
            if 0 < len(xs) <= 8:  # a short log axis has few decades: label the values we ran instead
                ax.xaxis.set_minor_locator(NullLocator())
                ax.set_xticks(xs, [f"{v:.3g}" for v in xs])
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.margins(0.12)  # room for the point labels
        if not series:
            ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        if series:
            ax.legend(loc="best")
        fig.tight_layout()
        save_png(fig, path)
