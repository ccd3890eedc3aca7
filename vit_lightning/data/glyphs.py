"""Position benchmarks whose answers are known: procedural glyphs, and MNIST digits translated on a larger canvas.

`glyphs` draws small squares of four textures (solid, checker, horizontal and vertical stripes; 6-8 px whatever the
canvas, so that a piece of a glyph cut by a patch border still shows its kind) on a noisy canvas of any size, at pixel
offsets that ignore the patch grid: a larger canvas means more tokens with the same patch content. Each image is
rendered from (seed, index) alone. `data.task` picks the question, four balanced classes each (class = index mod 4):
- absolute: which quadrant of the canvas holds the solid glyph (two striped or checkered ones anywhere). A model
  blind to position is at chance: the patches of every class are drawn from one distribution, only their places
  differ.
- relative: where the checkered glyph lies from the solid one (right, left, below, above; 9-13 px apart), the pair
  anywhere: the label is the same under any translation, so only relative position answers it.
- position_free: the kind of glyph the canvas holds (2-3 of it, with two strokes as distractors): position carries
  no information, so every encoding should tie.
`translated_mnist` pastes each mnist5k digit at a random offset in a larger canvas (42 px by default): fresh
offsets every time a training image is read, fixed ones (from the seed and the index) for validation.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils.data import Dataset

from vit_lightning.data.sources import MNIST_STATS, Source, read_mnist5k, stratified_split

KINDS = ("solid", "checker", "hstripes", "vstripes")
TASKS = ("absolute", "relative", "position_free")
SIZES = (6, 7, 8)  # a glyph's side in pixels, the same on every canvas
RELATIONS = ("right", "left", "below", "above")  # relative task: where the checkered glyph lies from the solid one
NOISE = 0.25  # pixel noise, uniform in [0, NOISE) of full scale
GLYPHS_SIZE = 36  # the default canvas: 6 x 6 patches of 6 px
TRANSLATED_SIZE = 42  # the default canvas of translated_mnist: a 28 px digit moves over 15 x 15 offsets


def stamp(kind: str, k: int) -> np.ndarray:
    """A glyph's (k, k) mask: a square of one texture, which any 2 x 2 piece of it shows."""
    y, x = np.mgrid[:k, :k]
    masks = {"solid": np.ones((k, k), bool), "checker": (y + x) % 2 == 0, "hstripes": y % 2 == 0,
             "vstripes": x % 2 == 0}
    return masks[kind]


def _draw(canvas: np.ndarray, kind: str, k: int, top: int, left: int, level: float) -> None:
    window = canvas[top:top + k, left:left + k]
    np.maximum(window, np.where(stamp(kind, k), level, 0.0), out=window)


def _stroke(canvas: np.ndarray, rng: np.random.Generator) -> None:
    """A distractor: a 1-px horizontal or vertical line, 3-5 px long, anywhere."""
    size, length = canvas.shape[0], int(rng.integers(3, 6))
    top, left = (int(v) for v in rng.integers(0, size - length + 1, 2))
    if rng.random() < 0.5:
        canvas[top, left:left + length] = np.maximum(canvas[top, left:left + length], rng.uniform(0.6, 1.0))
    else:
        canvas[top:top + length, left] = np.maximum(canvas[top:top + length, left], rng.uniform(0.6, 1.0))


def _anywhere(rng: np.random.Generator, size: int, k: int) -> tuple[int, int]:
    return int(rng.integers(0, size - k + 1)), int(rng.integers(0, size - k + 1))


def _absolute(rng, size: int, label: int) -> list[tuple[str, int, int, int]]:
    half = size // 2
    glyphs = [(str(rng.choice(KINDS[1:])), int(k), *_anywhere(rng, size, int(k))) for k in rng.choice(SIZES, 2)]
    k = int(rng.choice(SIZES))
    row, col = divmod(label, 2)  # the solid glyph's quadrant: it lies wholly inside it
    top = row * (size - half) + int(rng.integers(0, half - k + 1))
    left = col * (size - half) + int(rng.integers(0, half - k + 1))
    return glyphs + [("solid", k, top, left)]


def _relative(rng, size: int, label: int) -> list[tuple[str, int, int, int]]:
    glyphs = [(str(rng.choice(KINDS[2:])), int(k), *_anywhere(rng, size, int(k)))
              for k in rng.choice(SIZES, int(rng.integers(0, 2)))]
    k = int(rng.choice(SIZES))
    far = int(rng.integers(max(SIZES) + 1, max(SIZES) + 6))  # along the relation's axis: 9-13 px, never overlapping
    side = int(rng.integers(-(far // 2), far // 2 + 1))  # across it: less than half as far, so never ambiguous
    dy, dx = {"right": (side, far), "left": (side, -far), "below": (far, side), "above": (-far, side)}[RELATIONS[label]]
    top = int(rng.integers(max(0, -dy), size - k - max(0, dy) + 1))
    left = int(rng.integers(max(0, -dx), size - k - max(0, dx) + 1))
    return glyphs + [("solid", k, top, left), ("checker", k, top + dy, left + dx)]


def _position_free(rng, size: int, label: int) -> list[tuple[str, int, int, int]]:
    return [(KINDS[label], int(k), *_anywhere(rng, size, int(k))) for k in rng.choice(SIZES, int(rng.integers(2, 4)))]


PLACERS = {"absolute": _absolute, "relative": _relative, "position_free": _position_free}


def render(seed: int, index: int, size: int, task: str) -> tuple[np.ndarray, int, list[tuple[str, int, int, int]]]:
    """Image `index` of the `task` set from `seed`: float (size, size) in [0, 1], its label, and its glyphs as
    (kind, side, top, left) in drawing order."""
    rng = np.random.default_rng((seed, index, TASKS.index(task)))
    label = index % 4
    canvas = rng.uniform(0.0, NOISE, (size, size))
    glyphs = PLACERS[task](rng, size, label)
    if task == "position_free":
        for _ in range(2):
            _stroke(canvas, rng)
    for kind, k, top, left in glyphs:
        _draw(canvas, kind, k, top, left, rng.uniform(0.7, 1.0))
    return canvas, label, glyphs


def render_set(seed: int, count: int, size: int, task: str, scale: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Images 0..count-1 as uint8 (count, 1, size, size) and their int64 (count,) labels; scale > 1 draws each at
    size / scale and enlarges every pixel to scale x scale (glyphs and noise alike)."""
    images = np.empty((count, 1, size, size), np.uint8)
    block = np.ones((scale, scale))
    for i in range(count):
        images[i, 0] = np.round(np.kron(render(seed, i, size // scale, task)[0], block) * 255)
    return torch.from_numpy(images), torch.arange(count, dtype=torch.int64) % 4


class Glyphs(Source):
    """The procedural position benchmark (module docstring), rendered in memory at the canvas asked for."""

    num_classes, in_chans, native_size = 4, 1, GLYPHS_SIZE
    stats, default_flip, default_crop, in_memory = ((0.19,), (0.18,)), False, False, True  # measured on 6,000
    tasks, renders, smallest = TASKS, True, 22  # 22 px: the relative task's glyphs fit at their farthest (8 + 13)
    size = 4000  # images per (seed, task): 3,200 train and 800 val at the default val_split

    def load(self, train_tf=None, val_tf=None):
        x, y = render_set(self.split_seed, self.size, self.canvas, self.task, self.glyph_scale)
        tr, va = stratified_split(y, self.val_split, self.split_seed)
        return (x[tr], y[tr]), (x[va], y[va])


class Placed(Dataset):
    """uint8 (N, C, h, w) images pasted onto a zero (size, size) canvas: at fixed offsets, or anew at each read."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int, offsets: torch.Tensor | None):
        self.images, self.labels, self.size, self.offsets = images, labels, size, offsets  # offsets: (N, 2) or None
        self.transform = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.images[i]
        room = self.size - img.shape[-1]
        top, left = (int(v) for v in (self.offsets[i] if self.offsets is not None else torch.randint(0, room + 1, (2,))))
        canvas = torch.zeros(img.shape[0], self.size, self.size, dtype=img.dtype)
        canvas[:, top:top + img.shape[-2], left:left + img.shape[-1]] = img
        return canvas, int(self.labels[i])

    def subset(self, index: torch.Tensor) -> Placed:
        """The images at `index` (offsets kept)."""
        offsets = None if self.offsets is None else self.offsets[index]
        return Placed(self.images[index], self.labels[index], self.size, offsets)

    def unaugmented(self, seed: int) -> Placed:
        """The same images at fixed offsets (drawn from seed), as validation reads them."""
        view = copy.copy(self)
        view.offsets = fixed_offsets(seed, len(self.labels), self.size - self.images.shape[-1])
        return view


def fixed_offsets(seed: int, count: int, room: int) -> torch.Tensor:
    """(count, 2) offsets in [0, room], the same for the same seed."""
    return torch.randint(0, room + 1, (count, 2), generator=torch.Generator().manual_seed(seed))


class TranslatedMnist(Source):
    """mnist5k's digits at random places on a larger canvas (module docstring)."""

    num_classes, in_chans, native_size = 10, 1, TRANSLATED_SIZE
    stats, default_flip, default_crop, in_memory = MNIST_STATS, False, False, True
    renders, smallest = True, 28

    def load(self, train_tf=None, val_tf=None):
        x, y = read_mnist5k()
        tr, va = stratified_split(y, self.val_split, self.split_seed)
        room = self.canvas - x.shape[-1]
        return (Placed(x[tr], y[tr], self.canvas, None),
                Placed(x[va], y[va], self.canvas, fixed_offsets(self.split_seed + 1, len(va), room)))
