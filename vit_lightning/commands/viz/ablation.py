"""The analysis figures `vit-ablate table` writes: one run per variant, plus side-by-side comparisons.

Figures need checkpoints, which only local run dirs hold (results/ keeps records only): without
them the table says so and leaves the committed figures as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vit_lightning.commands.viz.figures import Panel, distance_figure, panels_figure, similarity_mosaic, write_csv
from vit_lightning.commands.viz.run import Numbers, compute, draw, load_run, max_distance, offset_extent
from vit_lightning.core.names import LAST_CKPT
from vit_lightning.model.family import DEFAULT_ARCH, FAMILIES
from vit_lightning.model.position import NO_POSITION

ENCODING = "model.pos_encoding"
# the attention-distance comparison: why no position is worse than the default family's default encoding
DISTANCE_PAIR = (NO_POSITION, FAMILIES[DEFAULT_ARCH].defaults["pos_encoding"])


def variant_label(cell: dict) -> str:
    """A cell's folder name: string values as they are, numbers after their key (lr0.001)."""
    parts = [f"{key.rsplit('.', 1)[-1]}{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool)
             else str(value) for key, value in cell.items()]
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in "-".join(parts))


def pick_runs(profile, runs: Path, candidates: list[list[str]]) -> dict[str, tuple[dict, Path | None]]:
    """Per designed cell (by label): the cell and the first of its table's runs (candidates) with a checkpoint."""
    chosen = {}
    for cell, names in zip(profile.cells(), candidates, strict=True):
        directory = next((Path(runs) / name for name in names if (Path(runs) / name / LAST_CKPT).is_file()), None)
        chosen[variant_label(cell)] = (cell, directory)
    return chosen


def write_ablation_figures(ablation, profile: str, runs_root: Path, out: Path, candidates: list[list[str]],
                           images: int = 32) -> tuple[list[Path], list[str]]:
    """Draw one run per variant into out/figures/VARIANT/ and the ablation's comparisons into out/.

    candidates: per designed cell, the names of the runs its table cell averages, in the table's order;
    the first with a checkpoint in runs_root/ABLATION/PROFILE/NAME/ is drawn. Returns the paths written
    and notes for the user (variants without a checkpoint).
    """
    runs = Path(runs_root) / ablation.name / profile
    chosen = pick_runs(ablation.table_profile(profile), runs, candidates)
    missing = [label for label, (_, d) in chosen.items() if d is None]
    if len(missing) == len(chosen):
        return [], [f"figures: no completed run with {LAST_CKPT} and the profile's settings under {runs} "
                    f"(results/ keeps records only); the figures in {out} were left as they are"]
    paths, drawn = [], []
    for label, (cell, directory) in chosen.items():
        if directory is not None:
            numbers = compute(load_run(directory, images))
            paths += draw(numbers, Path(out) / "figures" / label)
            drawn.append((cell, numbers))
    notes = [f"figures: no checkpoint for {', '.join(missing)}"] if missing else []
    if any(ENCODING in cell for cell, _ in drawn):
        if all(isinstance(numbers, Numbers) for _, numbers in drawn):
            paths += encoding_comparison(drawn, Path(out))
        else:  # another family: its figures are per run (figures/<cell>/), by stage and window
            notes.append("figures: the side-by-side encoding comparison is drawn for ViT runs only")
    return paths, notes


def encoding_comparison(drawn: list[tuple[dict, Numbers]], out: Path) -> list[Path]:
    """Every encoding's position figure side by side, and the attention distance of DISTANCE_PAIR's two."""
    first: dict[str, Numbers] = {}
    for cell, numbers in drawn:  # cells come in design order, so each encoding's first is its stem run
        first.setdefault(cell[ENCODING], numbers)
    panels = [encoding_panel(name, numbers) for name, numbers in first.items()]
    paths = [panels_figure(out / "pos_similarity.png", panels, "Position embeddings: each patch's similarity to all "
                           "others (relative encodings: layer-1 bias by offset, head mean; a convolution: its kernels' mean |w|)",
                           columns=len(panels))]
    rows = [(name, t, q, k, float(sim[q, k])) for name, n in first.items() for t, sim in enumerate(n.similarity or [])
            for q in range(sim.shape[0]) for k in range(sim.shape[1])]
    paths.append(write_csv(out / "pos_similarity.csv", ["encoding", "table", "query", "key", "cosine"], rows))
    pair = [(name, first[name]) for name in DISTANCE_PAIR if name in first and first[name].distance is not None]
    if pair:
        series = [(name, n.distance) for name, n in pair]
        paths.append(distance_figure(out / "attention_distance.png", series, max(max_distance(n) for _, n in pair),
                                     "Mean attention distance per head: " + " vs ".join(n for n, _ in pair)))
        rows = [(name, layer + 1, head + 1, float(d[layer, head])) for name, d in series
                for layer in range(d.shape[0]) for head in range(d.shape[1])]
        paths.append(write_csv(out / "attention_distance.csv", ["encoding", "layer", "head", "distance_px"], rows))
    return paths


def encoding_panel(name: str, numbers: Numbers) -> Panel:
    """One encoding's panel: the first table's tiled similarity, a relative bias map, or a note."""
    if numbers.similarity is not None:
        return Panel(name, similarity_mosaic(numbers.similarity[0], numbers.grid), -1.0, 1.0, "cosine similarity")
    if numbers.bias is not None:
        bias = numbers.bias[0].mean(axis=0)  # (2H-1, 2W-1)
        lim = float(np.abs(bias).max()) or 1.0
        return Panel(name, bias, -lim, lim, "logit bias", offset_extent(numbers.grid))
    if numbers.kernels is not None:  # a convolving encoding: its first kernels, channel-mean magnitude by offset
        mean = np.abs(numbers.kernels[0]).mean(axis=0)
        return Panel(name, mean, 0.0, float(mean.max()) or 1.0, "mean |kernel|", offset_extent((2, 2)))
    return Panel(name, None, 0.0, 0.0, "", note="no position encoding:\nnothing to draw")
