"""RoPE's figures: the attention logit a query gives each 2-D offset, and RoPE-Mixed's learned frequencies."""

from __future__ import annotations

from pathlib import Path

import matplotlib.style
import numpy as np
import torch
from matplotlib import rc_context
from matplotlib.figure import Figure

from vit_lightning.commands.viz.figures import MARKERS, Panel, panels_figure, suptitle, write_csv, write_note
from vit_lightning.core.plotstyle import STYLE, save_png


def is_rope(vit) -> bool:
    return bool(len(getattr(vit.pos, "rotations", ())))


def learned_frequencies(vit) -> np.ndarray | None:
    """(L, 2, heads, hd/2) RoPE-Mixed's learned (fx, fy) per block, head and channel pair; None if fixed."""
    freqs = [r.freqs for r in vit.pos.rotations]
    if not freqs or not isinstance(freqs[0], torch.nn.Parameter):
        return None
    return torch.stack([f.detach().double() for f in freqs]).numpy()


@torch.no_grad()
def offset_logits(vit, images: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    """(L, heads, 2H-1, 2W-1) the mean attention logit q_i . k_j / sqrt(hd) over patch pairs at each offset
    (query - key), over the images' patch queries; RoPE applied as the model applies it."""
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for b in vit.blocks]
    try:
        vit(images)
    finally:
        for hook in hooks:
            hook.remove()
    h, w = grid
    rows, cols = torch.div(torch.arange(h * w), w, rounding_mode="floor"), torch.arange(h * w) % w
    offset = ((rows[:, None] - rows[None] + h - 1) * (2 * w - 1) + cols[:, None] - cols[None] + w - 1).flatten()
    counts = torch.bincount(offset, minlength=(2 * h - 1) * (2 * w - 1)).double()
    out = []
    for i, (block, x) in enumerate(zip(vit.blocks, inputs)):
        attn, (b, t, d) = block.attn, x.shape
        q, k, _ = attn.qkv(x).view(b, t, 3, attn.heads, d // attn.heads).permute(2, 0, 3, 1, 4)
        q, k = vit.pos.rotation(i).rotate(attn.q_norm(q), attn.k_norm(k))
        p = vit.num_prefix
        logits = (q[:, :, p:] @ k[:, :, p:].transpose(-2, -1)).double().mean(0) * q.shape[-1] ** -0.5  # (h, N, N)
        sums = torch.zeros(attn.heads, len(counts), dtype=torch.float64)
        sums.index_add_(1, offset, logits.flatten(1))
        out.append((sums / counts).view(attn.heads, 2 * h - 1, 2 * w - 1))
    return torch.stack(out).numpy()


def draw(vit_title: str, logits: np.ndarray | None, freqs: np.ndarray | None, grid, extent, out: Path) -> list[Path]:
    """rope_offsets.png/.csv (when images were given) and rope_frequencies.png/.csv, or a note for fixed ones."""
    out, paths = Path(out), []
    if logits is not None:
        layers, heads = logits.shape[:2]
        panels = [Panel(f"layer {layer + 1}, head {head + 1}", logits[layer, head], float(logits[layer, head].min()),
                        float(logits[layer, head].max()), "mean logit", extent)
                  for layer in range(layers) for head in range(heads)]
        paths.append(panels_figure(out / "rope_offsets.png", panels, "Mean attention logit by offset (query - key)\n"
                                   f"{vit_title}", columns=heads))
        h, w = grid
        rows = [(layer + 1, head + 1, r - (h - 1), c - (w - 1), float(logits[layer, head, r, c]))
                for layer in range(layers) for head in range(heads) for r in range(2 * h - 1) for c in range(2 * w - 1)]
        paths.append(write_csv(out / "rope_offsets.csv", ["layer", "head", "d_row", "d_col", "mean_logit"], rows))
    if freqs is None:
        paths.append(write_note(out / "rope_frequencies.txt", "axial RoPE: the frequencies are fixed (theta^(-k/(hd/4)) "
                                "along x for half the channel pairs, along y for the rest), nothing learned to draw"))
        return paths
    paths.append(_frequency_figure(out / "rope_frequencies.png", freqs, f"Learned RoPE frequencies (fx, fy)\n{vit_title}"))
    rows = [(layer + 1, head + 1, pair + 1, float(freqs[layer, 0, head, pair]), float(freqs[layer, 1, head, pair]))
            for layer in range(freqs.shape[0]) for head in range(freqs.shape[2]) for pair in range(freqs.shape[3])]
    paths.append(write_csv(out / "rope_frequencies.csv", ["layer", "head", "pair", "fx", "fy"], rows))
    return paths


def _frequency_figure(path: Path, freqs: np.ndarray, title: str) -> Path:
    """One panel per layer: every channel pair's 2-D frequency as a point, one marker and colour per head."""
    layers, heads = freqs.shape[0], freqs.shape[2]
    lim = float(np.abs(freqs).max()) * 1.1 or 1.0
    with matplotlib.style.context("default"), rc_context(STYLE):
        fig = Figure(figsize=(2.4 * layers + 1.2, 2.8), layout="constrained")
        for layer, ax in enumerate(np.atleast_1d(fig.subplots(1, layers, squeeze=False)[0])):
            for head in range(heads):
                ax.scatter(freqs[layer, 0, head], freqs[layer, 1, head], s=10, marker=MARKERS[head % len(MARKERS)],
                           label=f"head {head + 1}")
            ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=f"layer {layer + 1}", xlabel="fx")
            ax.tick_params(labelsize=7)
        fig.axes[0].set_ylabel("fy")
        fig.legend(*fig.axes[0].get_legend_handles_labels(), fontsize=7, loc="outside right upper")
        suptitle(fig, title)
        return save_png(fig, path)
