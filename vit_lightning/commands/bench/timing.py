"""Timing: one training step, candidates timed in alternating rounds, the device's matmul peak."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

PRECISIONS = ("32", "bf16")


@dataclass
class Candidate:
    """One model in one mode (precision, compiled), with its own optimizer and measured step times."""

    name: str  # the model: "ours learned_1d/cls", "timm"
    model: torch.nn.Module
    precision: str  # "32" or "bf16" (autocast, as Lightning's bf16-mixed)
    compiled: bool
    step_s: list[float] = field(default_factory=list)  # mean seconds per step, one entry per round
    first_step_s: float = 0.0  # the first step: compilation, allocator and kernel autotuning included
    match_error: float | None = None  # outputs vs the eager fp32 model, see output_error

    def __post_init__(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    @property
    def mode(self) -> str:
        return ("fp32" if self.precision == "32" else "bf16") + ("+compile" if self.compiled else "")


def autocast(device: torch.device, precision: str):
    """bf16 autocast on the device (weights stay fp32), or nothing for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(c: Candidate, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward, cross-entropy, backward, AdamW update; returns the logits (B, K), detached."""
    with autocast(x.device, c.precision):
        logits = c.model(x)
    F.cross_entropy(logits.float(), y).backward()
    c.optimizer.step()
    c.optimizer.zero_grad(set_to_none=True)
    return logits.detach().float()


def time_steps(c: Candidate, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Mean seconds per training step over `steps` steps."""
    sync(x.device)
    start = time.perf_counter()
    for _ in range(steps):
        train_step(c, x, y)
    sync(x.device)
    return (time.perf_counter() - start) / steps


def run_round(cands: list[Candidate], x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    """Time every candidate once, in turn; rounds of these let drift in machine load hit all of them alike."""
    for c in cands:
        c.step_s.append(time_steps(c, x, y, steps))


def paired_ratio(step_s: list[float], baseline_s: list[float]) -> float:
    """Throughput of a candidate relative to a baseline: the median over rounds of baseline / candidate time."""
    return statistics.median(b / s for s, b in zip(step_s, baseline_s))


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int, min_s: float = 0.3, repeats: int = 3) -> float:
    """FLOP/s of a square matmul loop (2 n^3 FLOPs per product), the best of `repeats` timed loops."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: library init, kernel choice
    sync(device)
    start = time.perf_counter()
    torch.mm(a, b, out=out)
    sync(device)
    iters = max(1, int(min_s / max(time.perf_counter() - start, 1e-6)))  # each timed loop lasts ~min_s
    best = 0.0
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b, out=out)
        sync(device)
        best = max(best, 2 * size**3 * iters / (time.perf_counter() - start))
    return best


def output_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest deviation from the reference logits, in units of the reference's RMS."""
    return float((out.float() - ref.float()).abs().max() / ref.float().pow(2).mean().sqrt().clamp_min(1e-12))
