"""Oracles of the glyph tasks: how well what a position-blind or translation-invariant model could use predicts the label.

Each oracle renders images with `glyphs.render`, keeps one kind of evidence and fits a small model on it, scored on
held-out images: the configuration (the offsets of the other glyphs from the target), one glyph's place, the distance
between two glyphs, and a bag of patches (a model that sees the multiset of a grid's patches and nothing of their
places). A task answers only by the route it names when the oracles that bypass that route are at chance (0.25); what
is left above chance is a ceiling the table prints beside the cells.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from vit_lightning.data.glyphs import render

ORACLES = {"absolute": ("configuration", "bag"), "relative": ("solid_place", "checker_place", "distance", "bag"),
           "position_free": ("bag",)}
TARGET = "solid"  # the glyph each task asks about (its quadrant; the checkered glyph's side from it)


def _centre(glyph) -> np.ndarray:
    _, k, top, left = glyph
    return np.array([top + (k - 1) / 2, left + (k - 1) / 2])


def configuration(glyphs) -> list[float]:
    """The other glyphs' centre offsets from the target (in drawing order, 3 at most; zeros where there are fewer)."""
    target = _centre(next(g for g in glyphs if g[0] == TARGET))
    offsets = [(*(_centre(g) - target),) for g in glyphs if g[0] != TARGET][:3]
    return [v for off in offsets + [(0.0, 0.0)] * (3 - len(offsets)) for v in off] + [float(len(offsets))]


def place(kind: str):
    """Evidence: the centre of the glyph of `kind`."""
    return lambda glyphs: list(_centre(next(g for g in glyphs if g[0] == kind)))


def distance(glyphs) -> list[float]:
    """The distance between the solid and the checkered glyph's centres, with no direction."""
    return [float(np.hypot(*(_centre(glyphs[-1]) - _centre(glyphs[-2]))))]


EVIDENCE = {"configuration": configuration, "solid_place": place("solid"), "checker_place": place("checker"),
            "distance": distance}


@functools.lru_cache(maxsize=8)
def rendered(task: str, count: int, size: int = 36, version: int = 2, seed: int = 0):
    """(float (count, size, size) images, int (count,) labels, glyph lists) of images 0..count-1 (kept: read-only)."""
    images, labels, glyphs = zip(*(render(seed, i, size, task, version) for i in range(count)))
    return np.stack(images), np.array(labels), list(glyphs)


def tree_accuracy(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """Held-out accuracy (a quarter held out) of gradient-boosted trees on (N, F) features."""
    from sklearn.ensemble import HistGradientBoostingClassifier  # scikit-learn: a test and analysis dependency

    cut = len(labels) * 3 // 4
    model = HistGradientBoostingClassifier(max_iter=30, random_state=seed).fit(features[:cut], labels[:cut])
    return float((model.predict(features[cut:]) == labels[cut:]).mean())


def patches(images: np.ndarray, patch: int) -> torch.Tensor:
    """float (N, size, size) -> (N, tokens, patch * patch): the grid's patches, in no order the model may use."""
    n, size = images.shape[0], images.shape[-1] // patch * patch
    x = torch.as_tensor(images[:, :size, :size], dtype=torch.float32)
    return x.reshape(n, size // patch, patch, size // patch, patch).permute(0, 1, 3, 2, 4).reshape(n, -1, patch * patch)


def bag_accuracy(images: np.ndarray, labels: np.ndarray, patch: int = 6, steps: int = 200, seed: int = 0) -> float:
    """Held-out accuracy of a bag of patches: an MLP on each patch, averaged over the patches, then a linear head
    (permutation-invariant: it cannot see where a patch lies, only what the patches are)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: threads only wait on each other
    try:
        return _bag(images, labels, patch, steps, seed)
    finally:
        torch.set_num_threads(threads)


def _bag(images: np.ndarray, labels: np.ndarray, patch: int, steps: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    x, y = patches(images, patch), torch.as_tensor(labels)
    cut = len(y) * 3 // 4
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        embed = torch.nn.Sequential(torch.nn.Linear(patch * patch, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                    torch.nn.GELU())
        head = torch.nn.Linear(64, int(y.max()) + 1)
    params = [*embed.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(steps):
        pick = torch.randint(0, cut, (128,), generator=gen)
        loss = torch.nn.functional.cross_entropy(head(embed(x[pick]).mean(1)), y[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((head(embed(x[cut:]).mean(1)).argmax(1) == y[cut:]).float().mean())


def shared_patch_rate(glyphs: list, size: int = 36, patch: int = 6) -> float:
    """The share of images where one patch of the grid holds pixels of two glyphs (a place-free cue to how they lie)."""
    def cells(glyph) -> set[tuple[int, int]]:
        _, k, top, left = glyph
        return {(r, c) for r in range(top // patch, (top + k - 1) // patch + 1)
                for c in range(left // patch, (left + k - 1) // patch + 1)}

    shared = [any(cells(a) & cells(b) for i, a in enumerate(gs) for b in gs[i + 1:]) for gs in glyphs]
    return float(np.mean(shared))


def oracle_accuracy(name: str, images: np.ndarray, labels: np.ndarray, glyphs: list, patch: int = 6) -> float:
    """The held-out accuracy of oracle `name` (a key of EVIDENCE, or 'bag') on rendered images."""
    if name == "bag":
        return bag_accuracy(images, labels, patch)
    return tree_accuracy(np.array([EVIDENCE[name](g) for g in glyphs], dtype=np.float64), labels)


def ceilings(task: str, count: int = 4000, size: int = 36, version: int = 2, patch: int = 6) -> dict[str, float]:
    """Every oracle of `task`: name -> held-out accuracy on `count` renders."""
    images, labels, glyphs = rendered(task, count, size, version)
    return {name: round(oracle_accuracy(name, images, labels, glyphs, patch), 3) for name in ORACLES[task]}
