"""One run's analysis figures: load the checkpoint and validation images, compute the numbers, draw them."""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from vit_lightning.analysis.trained import Trained, TrainedError, build_data, load_trained
from vit_lightning.commands.viz import analysis, rope
from vit_lightning.commands.viz.figures import (
    Panel,
    components_figure,
    distance_figure,
    panels_figure,
    rollout_figure,
    similarity_mosaic,
    write_csv,
    write_note,
)
from vit_lightning.compat.wandb import env_mode
from vit_lightning.core.checks import one_line
from vit_lightning.model.family import ATTENTION_MAPS, TOKEN_GRID, Family, family_of
from vit_lightning.model.position import ENCODINGS, Relative1d
from vit_lightning.model.stems import PatchStem

SHOWN = 6  # validation images drawn with their rollout
COMPONENTS = 28  # principal components drawn, as in the paper's Figure 7


VizError = TrainedError  # a run that cannot be drawn; the message is one line naming the problem


@dataclass
class Run:
    """A trained backbone (float64, eval mode), a few of its validation images and its record."""

    vit: torch.nn.Module
    images: torch.Tensor | None  # (n, C, H, W) normalised, float64; None when none were asked for
    record: dict | None
    directory: Path  # the folder holding the checkpoint

    @property
    def title(self) -> str:
        """The run in one line, as its family describes it (Family.describe)."""
        return family_of(self.vit).describe(self.vit.config)


@dataclass
class Numbers:
    """Everything a run's figures show."""

    title: str
    grid: tuple[int, int]
    stride: float  # input pixels per token step
    similarity: list[np.ndarray] | None  # per position table, (N, N) cosine; None without absolute tables
    bias: np.ndarray | None  # (L, heads, 2H-1, 2W-1) relative-encoding bias by offset
    components: tuple[np.ndarray, np.ndarray] | None  # (k, C, P, P) and (k,) variance ratios; None: hybrid
    distance: np.ndarray | None = None  # (L, heads) mean attention distance in pixels
    images: np.ndarray | None = None  # (k, C, H, W) the images drawn with their rollout
    rollout: np.ndarray | None = None  # (k, H', W') rollout weights on the token grid
    high_norm: np.ndarray | None = None  # (L,) fraction of patch tokens whose output norm is high (analysis.HIGH_NORM)
    entropy: np.ndarray | None = None  # (L,) mean entropy of the patch queries' attention, nats
    rope: str | None = None  # the RoPE encoding's name; None: not RoPE
    rope_freqs: np.ndarray | None = None  # (L, 2, heads, hd/2) learned RoPE frequencies; None: fixed
    rope_logits: np.ndarray | None = None  # (L, heads, 2H-1, 2W-1) mean attention logit by offset, first image chunk
    kernels: np.ndarray | None = None  # (PEGs, D, 3, 3) the depthwise kernels of an encoding that convolves the grid
    bias_queries: str = ""  # which queries a query-dependent bias is drawn for
    notes: dict[str, str] = field(default_factory=dict)  # file stem -> why a figure does not apply (a capability)
    pos_note: str = ""  # why there is no position similarity to draw (the encoding's figure_note)
    filters_note: str = ""  # why there are no pixel filters to draw, where there are none (the family's figure_notes)


def load_run(path: Path, images: int) -> Run:
    """The ViT of a `vit-ablate fit` run (float64, eval mode) and `images` of its validation images."""
    trained = load_trained(path, data=False)
    shown = _validation_images(trained, images) if images else None
    return Run(trained.model.model.double().eval(), shown, trained.record, trained.checkpoint.parent)


def _validation_images(trained: Trained, count: int) -> torch.Tensor:
    """`count` validation images of the run's data, as the run's validation loader prepares them."""
    try:
        loader = build_data(trained.data_options).val_dataloader()
        # Evenly spread over the validation set: its order may follow the classes.
        picked = Subset(loader.dataset, np.linspace(0, len(loader.dataset) - 1, count).round().astype(int).tolist())
        batches = [x for x, _ in DataLoader(picked, batch_size=loader.batch_size, collate_fn=loader.collate_fn)]
    except (TrainedError, OSError) as error:
        raise VizError(f"{error}; pass --images 0 to draw only the weight figures") from None
    return torch.cat(batches).double()


@contextmanager
def _one_thread():
    """One CPU thread: the same summation order everywhere, so the numbers (and PNGs) repeat exactly."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def compute(run: Run, chunk: int = 8):
    """The numbers behind every figure of a run: its family's figures module's (`compute_numbers`), else the shared ones."""
    family = family_of(run.vit)
    with _one_thread():
        if family.viz is None:
            return shared_numbers(run, family)
        return importlib.import_module(family.viz).compute_numbers(run, chunk)


def pos_note(encoding: str) -> str:
    """The note standing for the position-similarity figure of an encoding without a table: its `figure_note`."""
    return f"pos_encoding={encoding}: {ENCODINGS[encoding].figure_note}"


def shared_numbers(run: Run, family: Family) -> Numbers:
    """A family without figures of its own: the patch-embedding filters where it has them; notes for the rest."""
    model = run.vit
    family.require(TOKEN_GRID, "the figures (drawn on the patch grid)")
    grid, stride = tuple(model.stem.grid_for(model.config.img_hw)), float(model.config.patch_size)
    components = None
    if isinstance(model.stem, PatchStem):  # a token grid is cut by its stem (TOKEN_GRID)
        comps, ratios = analysis.filter_components(model.stem.proj.weight, COMPONENTS)
        components = comps.numpy(), ratios.numpy()
    numbers = Numbers(family.describe(model.config), grid, stride, None, None, components,
                      pos_note=pos_note(model.config.pos_encoding))
    numbers.notes["attention"] = (family.lacks(ATTENTION_MAPS, "the attention distance and rollout figures") or
                                  f"arch={family.name} has no figures module to draw its attention maps with")
    if components is None:
        numbers.notes["patch_pca"] = f"arch={family.name}: no patch-embedding filters of pixels to draw"
    return numbers


@torch.no_grad()
def compute_numbers(run: Run, chunk: int = 8) -> Numbers:
    """The numbers behind every figure of a run of the family whose figures these are (its `viz` names this module)."""
    vit = run.vit
    grid, stride = tuple(vit.pos.grid), float(vit.stem.patch_size)
    tables = analysis.position_tables(vit)
    similarity = None if tables is None else [analysis.cosine_similarity(t).numpy() for t in tables]
    bias = analysis.relative_bias(vit, run.images, chunk)
    components = None
    if isinstance(vit.stem, PatchStem):  # the hybrid stem's 1x1 "patches" are ResNet features, not pixels
        comps, ratios = analysis.filter_components(vit.stem.proj.weight, COMPONENTS)
        components = comps.numpy(), ratios.numpy()
    numbers = Numbers(run.title, grid, stride, similarity, None if bias is None else bias.numpy(), components,
                      pos_note=pos_note(vit.config.pos_encoding),
                      filters_note=family_of(vit).figure_notes.get("patch_pca", "") if components is None else "")
    if rope.is_rope(vit):
        numbers.rope, numbers.rope_freqs = vit.config.pos_encoding, rope.learned_frequencies(vit)
    if (kernels := analysis.peg_kernels(vit)) is not None:
        numbers.kernels = kernels.numpy()
    if isinstance(vit.pos.parts[0], Relative1d):
        numbers.bias_queries = (f"mean of q.r over the patch queries of {len(run.images)} validation images"
                                if run.images is not None and len(run.images) else
                                "q.r of the zero-content query (no images: --images 0)")
    if run.images is not None and len(run.images):
        _attention_numbers(vit, run.images, numbers, chunk)
    return numbers


def _attention_numbers(vit, images: torch.Tensor, numbers: Numbers, chunk: int) -> None:
    """Mean attention distance over all images and the rollout of the first few, a chunk of images at a time."""
    prefix, total, maps = vit.num_prefix, None, []  # [class] and register tokens
    high, entropy = 0.0, 0.0
    for start in range(0, len(images), chunk):
        attention = vit.attention_maps(images[start: start + chunk])  # L x (b, h, T, T)
        part = analysis.attention_distance_sum(attention, numbers.grid, numbers.stride, prefix)
        total = part if total is None else total + part
        entropy = entropy + analysis.attention_entropy_sum(attention, prefix)
        high = high + analysis.high_norm_counts(analysis.block_outputs(vit, images[start: start + chunk]), prefix)
        if start == 0 and numbers.rope:
            numbers.rope_logits = rope.offset_logits(vit, images[:chunk], numbers.grid)
        if start < SHOWN:
            maps.append(analysis.rollout_on_grid(analysis.attention_rollout(attention), numbers.grid, prefix,
                                                    bool(vit.pool.num_prefix)))
    n = numbers.grid[0] * numbers.grid[1]
    numbers.distance = (total / (len(images) * n)).numpy()
    numbers.high_norm, numbers.entropy = (high / (len(images) * n)).numpy(), (entropy / (len(images) * n)).numpy()
    numbers.images = images[:SHOWN].numpy()
    numbers.rollout = torch.cat(maps)[:SHOWN].numpy()


QUARTERS = (1, 2, 3, 4)  # the registers table's layers: ceil(q L / 4), every layer of the 4-block demo


def artifact_metrics(numbers: Numbers) -> dict[str, float]:
    """Record metrics viz/high_norm_q<q>, viz/attn_entropy_q<q>: the artifact numbers at each quarter of the depth."""
    depth, out = len(numbers.high_norm), {}
    for q in QUARTERS:
        layer = -(-q * depth // 4) - 1  # 0-based index of layer ceil(q L / 4)
        out[f"viz/high_norm_q{q}"] = float(numbers.high_norm[layer])
        out[f"viz/attn_entropy_q{q}"] = float(numbers.entropy[layer])
    return out


def max_distance(numbers: Numbers) -> float:
    """The largest distance between two patch centres, in pixels (the y range of the distance plot)."""
    return float(analysis.patch_distances(numbers.grid, numbers.stride).max())


def position_panels(numbers: Numbers) -> list[Panel]:
    """One panel per absolute table (tiled similarity), or per layer and head of a relative bias."""
    if numbers.similarity is not None:
        many = len(numbers.similarity) > 1
        return [Panel(f"layer {i + 1}" if many else "patch positions", similarity_mosaic(sim, numbers.grid), -1.0,
                      1.0, "cosine similarity") for i, sim in enumerate(numbers.similarity)]
    if numbers.bias is not None:
        lim = float(np.abs(numbers.bias).max()) or 1.0
        extent = offset_extent(numbers.grid)
        layers = numbers.bias.shape[0]  # one row: the same bias in every layer (alibi_2d)
        return [Panel(f"layer {layer + 1}, head {head + 1}" if layers > 1 else f"every layer, head {head + 1}",
                      numbers.bias[layer, head], -lim, lim, "logit bias", extent) for layer in range(layers)
                for head in range(numbers.bias.shape[1])]
    return []


KERNEL_CHANNELS = 4  # channels drawn per PEG beside the channel mean: those with the largest kernels


def kernel_panels(kernels: np.ndarray) -> list[Panel]:
    """Per PEG (after block k): its kernels' channel-mean magnitude, then its largest channels' kernels."""
    lim = float(np.abs(kernels).max()) or 1.0
    extent = offset_extent((2, 2))  # neighbour offsets -1, 0, 1 on both axes
    panels = []
    for k, weights in enumerate(kernels):  # (D, 3, 3)
        after = f"after block {k + 1}"
        panels.append(Panel(f"{after}: mean |w|", np.abs(weights).mean(axis=0), -lim, lim, "kernel weight", extent))
        for c in np.argsort(-np.abs(weights).sum(axis=(1, 2)), kind="stable")[:KERNEL_CHANNELS]:
            panels.append(Panel(f"{after}: channel {c}", weights[c], -lim, lim, "kernel weight", extent))
    return panels


def offset_extent(grid: tuple[int, int]) -> tuple[float, float, float, float]:
    """imshow extent putting column offsets on x and row offsets on y (query - key)."""
    h, w = grid
    return (-(w - 1) - 0.5, (w - 1) + 0.5, (h - 1) + 0.5, -(h - 1) - 0.5)


def draw(numbers: Numbers, out: Path) -> list[Path]:
    """Write every figure with its CSV into out; notes (.txt) where a figure does not apply."""
    if not isinstance(numbers, Numbers):  # another family's numbers: drawn by the module that computed them
        return importlib.import_module(type(numbers).__module__).draw(numbers, out, _draw_components)
    out, paths = Path(out), [write_note(out / f"{stem}.txt", line) for stem, line in numbers.notes.items()]
    panels = position_panels(numbers)
    if numbers.similarity is not None:
        paths.append(panels_figure(out / "pos_similarity.png", panels, f"Position embedding similarity\n"
                                   f"{numbers.title}", columns=min(4, len(panels))))
        paths.append(write_csv(out / "pos_similarity.csv", ["table", "query_row", "query_col", "key_row", "key_col",
                                                            "cosine"], _similarity_rows(numbers)))
    elif numbers.bias is not None:
        heads = numbers.bias.shape[1]
        queries = f"\n{numbers.bias_queries}" if numbers.bias_queries else ""
        paths.append(panels_figure(out / "pos_bias.png", panels, f"Relative position bias by offset (query - key)"
                                   f"{queries}\n{numbers.title}", columns=heads, cmap="RdBu_r"))
        paths.append(write_csv(out / "pos_bias.csv", ["layer", "head", "d_row", "d_col", "bias"], _bias_rows(numbers)))
    else:  # no table and no bias: the encoding says why (and a convolving one has its kernels drawn)
        paths.append(write_note(out / "pos_similarity.txt", numbers.pos_note))
        if numbers.kernels is not None:
            paths += _draw_kernels(numbers, out)
    if numbers.rope:
        paths += rope.draw(numbers.title, numbers.rope_logits, numbers.rope_freqs, numbers.grid,
                           offset_extent(numbers.grid), out)
    paths += _draw_components(numbers, out)
    if numbers.distance is not None:
        paths += _draw_attention(numbers, out)
    return paths


def _draw_kernels(numbers: Numbers, out: Path) -> list[Path]:
    kernels = numbers.kernels
    rows = [(k + 1, c, dy - 1, dx - 1, float(kernels[k, c, dy, dx])) for k in range(kernels.shape[0])
            for c in range(kernels.shape[1]) for dy in range(3) for dx in range(3)]
    return [panels_figure(out / "peg_kernels.png", kernel_panels(kernels), "PEG 3x3 depthwise kernels by neighbour "
                          f"offset (key - query)\n{numbers.title}", columns=1 + KERNEL_CHANNELS, cmap="RdBu_r"),
            write_csv(out / "peg_kernels.csv", ["after_block", "channel", "d_row", "d_col", "weight"], rows)]


def _draw_components(numbers: Numbers, out: Path) -> list[Path]:
    if "patch_pca" in getattr(numbers, "notes", {}):
        return []  # its note says why
    if numbers.components is None:
        return [write_note(out / "patch_pca.txt", numbers.filters_note)]
    comps, ratios = numbers.components
    rows = [(i + 1, float(ratios[i]), c, y, x, float(comps[i, c, y, x])) for i in range(len(comps))
            for c in range(comps.shape[1]) for y in range(comps.shape[2]) for x in range(comps.shape[3])]
    return [components_figure(out / "patch_pca.png", comps, ratios, f"Principal components of the patch-embedding "
                              f"filters\n{numbers.title}"),
            write_csv(out / "patch_pca.csv", ["component", "variance_ratio", "channel", "y", "x", "value"], rows)]


def _draw_attention(numbers: Numbers, out: Path) -> list[Path]:
    dist = numbers.distance
    rows = [(layer + 1, head + 1, float(dist[layer, head])) for layer in range(dist.shape[0])
            for head in range(dist.shape[1])]
    grid = numbers.rollout.shape[1:]
    cells = [(i, r, c, float(numbers.rollout[i, r, c])) for i in range(len(numbers.rollout))
             for r in range(grid[0]) for c in range(grid[1])]
    return [
        distance_figure(out / "attention_distance.png", [(numbers.title, dist)], max_distance(numbers),
                        f"Mean attention distance\n{numbers.title}"),
        write_csv(out / "attention_distance.csv", ["layer", "head", "distance_px"], rows),
        rollout_figure(out / "rollout.png", numbers.images, numbers.rollout, numbers.stride,
                       f"Attention rollout\n{numbers.title}"),
        write_csv(out / "rollout.csv", ["image", "row", "col", "weight"], cells),
        write_csv(out / "artifacts.csv", ["layer", f"high_norm_fraction_{analysis.HIGH_NORM:g}x_median", "attention_entropy_nats"],
                  [(i + 1, float(h), float(e)) for i, (h, e) in enumerate(zip(numbers.high_norm, numbers.entropy))]),
    ]


def _similarity_rows(numbers: Numbers):
    h, w = numbers.grid
    for t, sim in enumerate(numbers.similarity):
        for q in range(h * w):
            for k in range(h * w):
                yield t, q // w, q % w, k // w, k % w, float(sim[q, k])


def _bias_rows(numbers: Numbers):
    layers, heads, rows, cols = numbers.bias.shape
    h, w = numbers.grid
    for layer in range(layers):
        for head in range(heads):
            for r in range(rows):
                for c in range(cols):
                    yield layer + 1, head + 1, r - (h - 1), c - (w - 1), float(numbers.bias[layer, head, r, c])


def log_to_wandb(run: Run, paths: list[Path]) -> str | None:
    """Log the PNGs to the W&B run the record names (offline when it logged offline); a line saying what happened."""
    info = (run.record or {}).get("wandb") or {}
    run_id, pngs = info.get("run_id"), [p for p in paths if p.suffix == ".png"]
    if not run_id or not pngs:
        return None
    if env_mode() == "disabled":
        return "W&B is disabled (WANDB_MODE=disabled): figures not logged"
    offline = any((run.directory / "wandb").glob(f"offline-run-*-{run_id}"))
    mode = "offline" if offline or env_mode() == "offline" else "online"
    try:
        import wandb

        logged = wandb.init(id=run_id, project=info.get("project"), resume="allow", mode=mode,
                            dir=str(run.directory))
        logged.log({f"viz/{p.stem}": wandb.Image(str(p)) for p in pngs})
        logged.finish()
    except Exception as error:  # no credentials, no network: the files are written anyway
        return f"could not log the figures to W&B run {run_id}: {one_line(error)}"
    return f"logged {len(pngs)} figure(s) to W&B run {run_id} ({mode})"
