"""Where a learning-rate curve peaks: a parabola in log(lr) around the best grid point, bootstrapped over seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DRAWS = 2000  # bootstrap resamples; a fixed generator seed keeps the tables byte-stable
LEVEL = 0.95  # confidence level of the intervals


def peak(lrs: Sequence[float], means: Sequence[float]) -> float:
    """The lr where a parabola in log10(lr) through the best grid point and its two neighbours peaks.

    At the grid's edge the three outermost points are used; the peak stays within those three
    points (a convex or flat fit peaks at the best grid point itself).
    """
    x, y = np.log10(np.asarray(lrs, dtype=float)), np.asarray(means, dtype=float)
    best = int(np.argmax(y))
    lo = min(max(best - 1, 0), len(x) - 3)
    xs, ys = x[lo:lo + 3], y[lo:lo + 3]  # (3,)
    a, b, _ = np.polyfit(xs, ys, 2)
    top = -b / (2 * a) if a < 0 else x[best]
    return float(10 ** np.clip(top, xs[0], xs[-1]))


@dataclass(frozen=True)
class Optimum:
    """A curve's fitted best lr, its bootstrap interval and the bootstrap draws (log10 lr), None without one."""

    lr: float
    low: float | None
    high: float | None
    edge: int  # -1 / +1: the best grid point is the smallest / largest lr, so the optimum may lie below / above
    draws: np.ndarray | None  # (DRAWS,) log10 of the peak in each resample


def optimum(lrs: Sequence[float], values: Sequence[Sequence[float]], seed: int = 0) -> Optimum:
    """Fitted optimum of one curve (lrs ascending, per-lr seed values); interval when every lr has n >= 2.

    The bootstrap resamples each lr's seeds with replacement (cells are independent runs) and refits.
    """
    means = [float(np.mean(v)) for v in values]
    best = int(np.argmax(means))
    lr, edge = peak(lrs, means), -1 if best == 0 else 1 if best == len(lrs) - 1 else 0
    if min(len(v) for v in values) < 2:
        return Optimum(lr, None, None, edge, None)
    rng = np.random.default_rng(seed)
    samples = [np.asarray(v, dtype=float)[rng.integers(0, len(v), (DRAWS, len(v)))].mean(1) for v in values]
    draws = np.log10([peak(lrs, row) for row in np.stack(samples, 1)])  # (DRAWS,)
    low, high = interval(draws)
    return Optimum(lr, 10 ** low, 10 ** high, edge, draws)


def interval(draws: np.ndarray) -> tuple[float, float]:
    """The central LEVEL percentile interval of bootstrap draws."""
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def ratio(a: Optimum, b: Optimum) -> tuple[float, float | None, float | None]:
    """a's optimum over b's, with the bootstrap interval of that ratio (None without draws on both sides)."""
    point = a.lr / b.lr
    if a.draws is None or b.draws is None:
        return point, None, None
    low, high = interval(a.draws - b.draws)  # independent resamples (own seeds), so pairing by index is fair
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
