"""RandAugment on a whole uint8 batch, drawn per sample: the loader's cost is per op group, not per image."""

from __future__ import annotations

import torch
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

    def magnitude_of(self, op: int, height: int, width: int) -> float:
        """The op's magnitude at this image size (before the sign); 0 for ops without one."""
        values = self.space[op][1][0](self.num_bins, height, width)
        return 0.0 if values is None else float(values[self.magnitude])

    def apply(self, x: torch.Tensor, ops: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """Round by round, run every (op, sign) group of samples of uint8 (B, C, H, W) through its op."""
        x = x.clone()
        h, w = x.shape[-2:]
        for round_ops, round_negative in zip(ops, negative):
            for op, (name, (_, signed)) in enumerate(self.space):
                if name == "Identity":
                    continue
                chosen = round_ops == op
                magnitude = self.magnitude_of(op, h, w)
                groups = [(chosen & ~round_negative, magnitude), (chosen & round_negative, -magnitude)]
                for mask, value in groups if signed else [(chosen, magnitude)]:
                    idx = mask.nonzero().flatten().to(x.device)  # chosen on the CPU: no device sync
                    if len(idx):
                        x[idx] = apply_op(self.ra, x[idx], name, value)
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, *self.draw(x.shape[0]))
