"""The statistics every report shares: mean and spread over seeds, Welch's t-test between two sets.

One place, so the comparison, the claims and the savings agree on what "mean ± std" and
"significant" mean (n - 1 in the std; no p-value from fewer than two seeds a side).
"""

from __future__ import annotations

import math
import statistics
import warnings

from scipy import stats

ALPHA = 0.05  # a difference is significant when Welch's p is below this


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0.0 for one value); (nan, nan) for none."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def welch_p(a: list[float], b: list[float], alternative: str = "two-sided") -> float:
    """Welch's t-test p-value; nan when either side has < 2 seeds or no variance at all.
    ``alternative="less"``: one-sided, that a's mean is below b's."""
    if len(a) < 2 or len(b) < 2 or (statistics.pstdev(a) == 0 and statistics.pstdev(b) == 0):
        return math.nan
    # Seeds of equal accuracy on one side make SciPy warn of "catastrophic cancellation" on the
    # terminal (final pass H): the p-value is still the test's; the warning is noise in a report.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)
