"""Equivalence, not just "no significant difference": the two one-sided tests (TOST) with Welch's
standard error. Three seeds that fail to show a difference are no evidence that there is none;
TOST asks instead whether the difference is shown to lie inside +-margin.

Equivalent (at alpha 0.05) exactly when the difference's 90% confidence interval lies inside
(-margin, +margin); the TOST p-value is the larger of the two one-sided p-values.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

ALPHA = 0.05


@dataclass(frozen=True)
class Tost:
    delta: float  # mean(a) - mean(b)
    low: float  # the 90% confidence interval of delta
    high: float
    p: float  # TOST p-value: < ALPHA means equivalent within the margin
    margin: float

    @property
    def equivalent(self) -> bool:
        return self.p < ALPHA


def tost(a: list[float], b: list[float], margin: float) -> Tost | None:
    """TOST of mean(a) - mean(b) against +-margin; None with fewer than 2 values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    delta = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:  # identical values on each side: the difference is known exactly
        inside = abs(delta) < margin
        return Tost(delta, delta, delta, 0.0 if inside else 1.0, margin)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(1 - ALPHA, df) * se
    p_low = stats.t.sf((delta + margin) / se, df)  # H0: delta <= -margin
    p_high = stats.t.cdf((delta - margin) / se, df)  # H0: delta >= +margin
    return Tost(delta, delta - half, delta + half, float(max(p_low, p_high)), margin)
