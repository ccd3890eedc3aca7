"""Seed-noise statistics: per-cell mean and sample std, Welch's t-test between cells."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats

ALPHA = 0.05  # p at or above this: the difference does not stand out from seed noise


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1, n); NaN mean for no values, NaN std for one."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else math.nan
    std = float(x.std(ddof=1)) if len(x) > 1 else math.nan
    return mean, std, len(x)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided Welch t-test p-value of a vs b; None when either side has fewer than two runs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None
    if a.std() == 0 and b.std() == 0:  # t is undefined (0/0 or x/0): equal means or a sure difference
        return 1.0 if a.mean() == b.mean() else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def fmt_p(p: float) -> str:
    """A p-value in fixed text."""
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def versus(values: Sequence[float], best: Sequence[float], is_best: bool = False) -> str:
    """How a cell compares to the best cell: 'best', 'n=1: no test', 'p=0.43 ≈ best' or 'p=0.012'."""
    if is_best:
        return "best"
    if len(values) == 0:
        return ""
    p = welch_p(values, best)
    if p is None:
        return "n=1: no test"
    return f"{fmt_p(p)} ≈ best" if p >= ALPHA else fmt_p(p)


def beats(a: Sequence[float], b: Sequence[float]) -> bool | None:
    """a's mean is higher than b's by more than seed noise (Welch p < ALPHA); None if untestable."""
    p = welch_p(a, b)
    return None if p is None else bool(np.mean(a) > np.mean(b) and p < ALPHA)


def verdict(flags: Sequence[bool | None]) -> str:
    """'yes' when every comparison holds, 'no' when one fails, else 'cannot tell'."""
    if flags and all(f is True for f in flags):
        return "yes"
    return "no" if any(f is False for f in flags) else "cannot tell"
