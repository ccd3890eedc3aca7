"""Evaluation views at a target side that separate more tokens from zoom (`vit-ablate eval --view`).

A run trained at side S is shown images of target side T in one of three views, each two steps from the images as
it trained on them: resize the image to side R, then centre it on a canvas of side C (cropped where R > C, a zero
border where R < C):
- tokens: R = S, C = T: the content at its trained pixel scale, more (or fewer) tokens over a larger (smaller)
  field of view; a dataset that draws its images (translated_mnist, glyphs) draws them on the T canvas instead;
- zoom: R = T, C = S: the content at T / S of its trained scale, the trained canvas and number of tokens;
- both: R = T, C = T: resized to T, the published protocol: zoom and more tokens at once.
Stored images meet the view from their own side (resized to R directly, one resampling); an image folder's are
resized as its validation transform resizes them (short side R / 0.875), then centred on C.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

VIEWS = ("tokens", "zoom", "both")


def geometry(view: str, trained: int, target: int) -> tuple[int, int]:
    """(R, C): the side the images are resized to and the canvas they are centred on, for `view` at `target`."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; valid: {', '.join(VIEWS)}")
    return {"tokens": (trained, target), "zoom": (target, trained), "both": (target, target)}[view]


def centre(x: torch.Tensor, side: int) -> torch.Tensor:
    """(..., h, w) centred on a (side, side) canvas: cropped where larger, a zero border where smaller (an odd margin's
    extra pixel after the image, so a pad and the crop back are inverse)."""
    pads = []
    for have in (x.shape[-1], x.shape[-2]):  # F.pad's order: last dimension first
        margin = side - have
        pads += [margin // 2, margin - margin // 2] if margin >= 0 else [-((-margin) // 2), -(-margin - (-margin) // 2)]
    return F.pad(x, pads)


class Centred:
    """A per-image transform: a (C, h, w) tensor centred on a (side, side) canvas (centre), picklable for workers."""

    def __init__(self, side: int):
        self.side = side

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return centre(image, self.side)
