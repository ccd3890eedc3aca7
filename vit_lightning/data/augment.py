"""RandAugment, random crop and flip on a whole uint8 batch, drawn per sample, on the CPU or on the batch's device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from vit_lightning.compat.torchvision import apply_op, augmentation_space


class BatchRandAugment:
    """torchvision's RandAugment (same ops, magnitudes, sign flips) with independent draws for every sample.

    v2.RandAugment on a batch would draw one op for all samples, and calling it per sample costs ~0.7 ms
    of Python per image. Here each of the `num_ops` rounds draws an op and a sign per sample, and the
    samples that drew the same (op, sign) go through torchvision's op together, on any device.
    """

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_bins: int = 31):
        self.num_ops, self.magnitude, self.num_bins = num_ops, magnitude, num_bins
        self.ra = v2.RandAugment(num_ops, magnitude, num_bins)  # owns the op table and applies one op

    @property
    def space(self) -> list:
        """[(op name, (magnitudes_fn, signed))]; looked up, not stored: the lambdas cannot be pickled to workers."""
        return augmentation_space(self.ra)

    def draw(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample op ids (num_ops, B) and negate-magnitude flags (num_ops, B), from the global CPU RNG."""
        ops = torch.randint(len(self.space), (self.num_ops, batch))
        negative = torch.rand(self.num_ops, batch) <= 0.5  # v2.RandAugment negates signed ops at p=0.5 too
        return ops, negative

    def draw_one(self) -> tuple[list[int], list[bool]]:
        """One sample's op ids and negate flags (num_ops each), drawn as v2.RandAugment draws them for one image: an
        op, then a sign only if the op is signed; so a batch drawn sample by sample matches per-image transforms."""
        ops, negative = [], []
        for _ in range(self.num_ops):
            op = int(torch.randint(len(self.space), ()))
            ops.append(op)
            # v2 draws a sign for a signed op that has magnitudes: every signed op of torchvision's table has them
            negative.append(bool(self.space[op][1][1] and torch.rand(()) <= 0.5))
        return ops, negative

    def magnitude_of(self, op: int, height: int, width: int) -> float:
        """The op's magnitude at this image size (before the sign); 0 for ops without one."""
        values = self.space[op][1][0](self.num_bins, height, width)
        return 0.0 if values is None else float(values[self.magnitude])

    def apply(self, x: torch.Tensor, ops: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """Round by round, run every (op, sign) group of samples of uint8 (B, C, H, W) through its op.

        The groups are planned on the CPU: one sort per round makes each group a contiguous slice, so on a GPU
        a round is one gather, one kernel per op on its slice and one scatter, with no host sync.
        """
        h, w = x.shape[-2:]
        space = self.space
        signed = torch.tensor([sign for _, (_, sign) in space])
        for round_ops, round_negative in zip(ops, negative):
            key = round_ops * 2 + (round_negative & signed[round_ops]).long()  # unsigned ops: one group
            order = torch.argsort(key, stable=True)
            counts = torch.bincount(key, minlength=2 * len(space)).tolist()  # CPU tensors: no device sync
            order = to_device(order, x.device)
            grouped = x[order]
            pieces, start = [], 0
            for k, count in enumerate(counts):
                if count:
                    name, magnitude = space[k // 2][0], self.magnitude_of(k // 2, h, w) * (-1 if k % 2 else 1)
                    piece = grouped[start:start + count]
                    pieces.append(piece if name == "Identity" else apply_op(self.ra, piece, name, magnitude))
                    start += count
            x = torch.empty_like(x).index_copy_(0, order, torch.cat(pieces))
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, *self.draw(x.shape[0]))


def to_device(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU index tensor on `device` without waiting for the device (pinned, asynchronous on a GPU)."""
    if device.type == "cpu":
        return index
    return index.pin_memory().to(device, non_blocking=True)


def random_crop_flip(x: torch.Tensor, pad: int, flip: bool) -> torch.Tensor:
    """Per-sample random crop (zero padding `pad`) and horizontal flip of (B, C, H, W), as one gather on x's device.

    The offsets and flips are drawn on the CPU from the global RNG, as the CPU loader draws them.
    """
    b, c, h, w = x.shape
    # v2.RandomCrop on a batch would draw one offset for all samples; draw one per sample instead.
    x = F.pad(x, (pad, pad, pad, pad)) if pad else x
    oy = torch.randint(0, 2 * pad + 1, (b, 1))
    ox = torch.randint(0, 2 * pad + 1, (b, 1))
    rows = oy + torch.arange(h)  # (B, H)
    cols = torch.arange(w).expand(b, w)  # (B, W)
    if flip:
        cols = torch.where(torch.rand(b, 1) < 0.5, w - 1 - cols, cols)
    cols = cols + ox
    rows, cols = to_device(rows.contiguous(), x.device), to_device(cols.contiguous(), x.device)
    idx_b = torch.arange(b, device=x.device).view(b, 1, 1, 1)
    idx_c = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return x[idx_b, idx_c, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]  # (B, C, H, W)
