"""Seed-noise statistics: per-cell mean and sample std, Welch's t-test, Holm's correction for a family of tests, and
the two one-sided tests (TOST) that can show two cells equivalent within a margin."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05  # family-wise error rate: a Holm-adjusted p below this stands out from seed noise


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


def tost_p(a: Sequence[float], b: Sequence[float], margin: float) -> float | None:
    """Equivalence of a and b within +-margin by two one-sided Welch tests (TOST): the larger of the p-values of
    'mean(a) - mean(b) > -margin' and '< margin'; small: equivalent. None with fewer than two runs on a side."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return None
    if a.std() == 0 and b.std() == 0:  # no spread: equivalent exactly when the difference lies inside the margin
        return 0.0 if abs(a.mean() - b.mean()) < margin else 1.0
    above = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
    below = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
    return float(max(above, below))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone); None entries are not tests and stay None."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        out[i] = running
    return out


@dataclass(frozen=True)
class Comparison:
    """One cell against a reference cell: difference of means, Welch p, Holm-adjusted p within its family."""

    diff: float  # mean(cell) - mean(reference)
    p: float | None  # None: fewer than two runs on a side
    holm: float | None
    n: int  # the smaller number of runs of the two sides
    equiv: float | None = None  # Holm-adjusted TOST p within the family (None: no margin, or n<2)

    @property
    def equivalent(self) -> bool:
        """Shown equivalent to the reference within the family's margin (Holm-adjusted TOST p below ALPHA)."""
        return self.equiv is not None and self.equiv < ALPHA

    @property
    def outcome(self) -> str:
        """'higher' or 'lower' when the Holm-adjusted p is below ALPHA, else 'not shown' or 'no test (n<2)'."""
        if self.holm is None:
            return "no test (n<2)"
        if self.holm >= ALPHA:
            return "not shown"
        return "higher" if self.diff > 0 else "lower"


def compare(cells: Sequence[Sequence[float]], reference: Sequence[float], margin: float = 0.0) -> list[Comparison]:
    """Each cell's values against the reference's, as one family of tests (Holm over the testable ones); with a
    margin, the equivalence tests too, Holm-corrected as their own family."""
    ps = [welch_p(values, reference) for values in cells]
    diffs = [float(np.mean(v) - np.mean(reference)) if len(v) and len(reference) else math.nan for v in cells]
    equiv = holm([tost_p(v, reference, margin) for v in cells]) if margin > 0 else [None] * len(cells)
    return [Comparison(d, p, h, min(len(v), len(reference)), e)
            for d, p, h, v, e in zip(diffs, ps, holm(ps), cells, equiv)]


def fmt_p(p: float | None) -> str:
    """A p-value in fixed text; '-' when there is none."""
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
