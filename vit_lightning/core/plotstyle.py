"""The figures' shared look and their byte-reproducible PNG writer (no pyplot, no version stamp)."""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.figure import Figure

from vit_lightning.core.files import write_atomic

# start from matplotlib's defaults (not the user's matplotlibrc) and pin what could still vary
STYLE = {"font.family": "DejaVu Sans", "font.size": 9, "figure.figsize": (5.0, 3.5), "figure.dpi": 100,
         "savefig.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "path.simplify": False}


def save_png(fig: Figure, path: Path) -> Path:
    """Write the figure as a PNG without a software/version stamp, atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_atomic(Path(path), buf.getvalue())
    return Path(path)
