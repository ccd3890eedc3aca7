"""Where a learning-rate curve peaks: a parabola in log(lr) around the best grid point, with a parametric bootstrap.

The interval redraws each cell's mean as its mean plus Student's t (n - 1 degrees of freedom) times its
standard error, and refits. Resampling the seeds themselves (a percentile bootstrap) covers the true
optimum only about 80% (n = 3) to 85% (n = 5) of the time: a resample of n seeds understates the
spread of a mean of n, most of all at small n. tests/test_results.py measures the coverage by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DRAWS = 2000  # bootstrap draws; a fixed generator seed keeps the tables byte-stable
LEVEL = 0.95  # confidence level of the intervals


def log_peaks(lrs: Sequence[float], means: np.ndarray) -> np.ndarray:
    """log10 of the lr where a parabola in log10(lr) through the best grid point and its two neighbours peaks.

    `means` is (R, L): R curves over the L ascending lrs; returns (R,). At the grid's edge the three
    outermost points are used; the peak stays within those three points (a convex or flat fit peaks
    at the best grid point itself).
    """
    x, y = np.log10(np.asarray(lrs, dtype=float)), np.atleast_2d(np.asarray(means, dtype=float))
    best = y.argmax(1)  # (R,)
    at = np.clip(best - 1, 0, len(x) - 3)[:, None] + np.arange(3)  # (R, 3)
    xs, ys = x[at], np.take_along_axis(y, at, 1)
    s1 = (ys[:, 1] - ys[:, 0]) / (xs[:, 1] - xs[:, 0])  # slopes of the two chords
    s2 = (ys[:, 2] - ys[:, 1]) / (xs[:, 2] - xs[:, 1])
    a = (s2 - s1) / (xs[:, 2] - xs[:, 0])  # the parabola a x^2 + b x + c through the three points
    b = s1 - a * (xs[:, 0] + xs[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.where(a < 0, -b / (2 * a), x[best])
    return np.clip(top, xs[:, 0], xs[:, 2])


def peak(lrs: Sequence[float], means: Sequence[float]) -> float:
    """The fitted best lr of one curve (see `log_peaks`)."""
    return float(10 ** log_peaks(lrs, np.asarray(means, dtype=float)[None])[0])


@dataclass(frozen=True)
class Optimum:
    """A curve's fitted best lr, its bootstrap interval and the bootstrap draws (log10 lr), None without one."""

    lr: float
    low: float | None
    high: float | None
    edge: int  # -1 / +1: the best grid point is the smallest / largest lr, so the optimum may lie below / above
    draws: np.ndarray | None  # (DRAWS,) log10 of the peak in each bootstrap draw


def optimum(lrs: Sequence[float], values: Sequence[Sequence[float]], seed: int = 0) -> Optimum:
    """Fitted optimum of one curve (lrs ascending, per-lr seed values); interval when every lr has n >= 2.

    Each draw takes every cell's mean as mean + t * sd / sqrt(n), t from Student's t with n - 1 degrees of
    freedom (the cells are independent runs), and refits.
    """
    means = [float(np.mean(v)) for v in values]
    best = int(np.argmax(means))
    lr, edge = peak(lrs, means), -1 if best == 0 else 1 if best == len(lrs) - 1 else 0
    if min(len(v) for v in values) < 2:
        return Optimum(lr, None, None, edge, None)
    rng = np.random.default_rng(seed)
    n = np.array([len(v) for v in values])  # (L,)
    sem = np.array([np.std(v, ddof=1) for v in values]) / np.sqrt(n)
    draws = log_peaks(lrs, means + rng.standard_t(n - 1, (DRAWS, len(n))) * sem)  # (DRAWS,)
    low, high = interval(draws)
    return Optimum(lr, 10 ** low, 10 ** high, edge, draws)


def interval(draws: np.ndarray) -> tuple[float, float]:
    """The central LEVEL interval of bootstrap draws (their percentiles)."""
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def ratio(a: Optimum, b: Optimum) -> tuple[float, float | None, float | None]:
    """a's optimum over b's, with the bootstrap interval of that ratio (None without draws on both sides)."""
    point = a.lr / b.lr
    if a.draws is None or b.draws is None:
        return point, None, None
    low, high = interval(a.draws - b.draws)  # independent draws (own generator seeds), so pairing by index is fair
    return point, 10 ** low, 10 ** high


def differ(a: Optimum, b: Optimum) -> str:
    """Whether a's and b's optima differ: 'yes', 'not shown', or 'cannot tell (...)' with the reason.

    An optimum at the grid's edge may lie beyond it; a difference still holds when that can only widen it.
    """
    _, low, high = ratio(a, b)
    if low is None:
        return "cannot tell (n<2)"
    if low <= 1 <= high:
        return "not shown"
    widen = 1 if low > 1 else -1  # a above b: a's optimum further up or b's further down only widens the gap
    if a.edge not in (0, widen) or b.edge not in (0, -widen):
        return "cannot tell (an optimum at the grid's edge may lie beyond it)"
    return "yes"


def fmt_lr(lr: float | None) -> str:
    """A learning rate to two significant digits, e.g. 0.0029."""
    return "-" if lr is None or not math.isfinite(lr) else f"{lr:.2g}"
