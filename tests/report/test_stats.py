"""The shared statistics (report/stats.py)."""

from __future__ import annotations

import math
import warnings

import pytest

from ampbench.report.stats import mean_std, welch_p


@pytest.mark.parametrize(
    ("a", "b"),
    [([0.5, 0.5, 0.5], [0.4, 0.41, 0.42]), ([0.8463] * 3, [0.8463, 0.8463, 0.8464])],
)
def test_seeds_of_equal_accuracy_give_a_p_value_without_a_warning(a, b):
    """Final pass H: compare printed SciPy's 2-line "catastrophic cancellation" RuntimeWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = welch_p(a, b)
    assert 0 <= p <= 1


def test_too_few_seeds_or_no_spread_give_no_p_value():
    assert math.isnan(welch_p([0.5], [0.4, 0.41])) and math.isnan(welch_p([0.5, 0.5], [0.5, 0.5]))
    assert mean_std([]) == (pytest.approx(math.nan, nan_ok=True),) * 2 and mean_std([2.0]) == (2.0, 0.0)
