"""The measurement checks itself: a speed that varies more than it should is flagged "noisy".

A variant is noisy when the epochs of one of its seeds (after the first, warm-up epoch) vary by
more than ``LIMIT`` (coefficient of variation: std / mean), when its seeds' mean images/s differ
by more than ``LIMIT`` (max − min against their mean), or when a slow MLflow store overlapped a
timed epoch (the loop counts those). A measure of ``ampbench bench`` or ``ampbench explain`` is
noisy when its timed windows vary by more than ``LIMIT``. Steady measurements say nothing; a
noisy one says why where it is known, in the comparison's table, the variant's MLflow run and
docs/FINDINGS.md. What the flag means: the figure is not one speed but several (another process
on the GPU, the host stalling the device, thermal throttling), so a mean of it under-states what
the step can do; re-run on a quiet machine before quoting it.
"""

from __future__ import annotations

import math
import statistics

LIMIT = 0.05


def cv(values: list[float]) -> float:
    """Coefficient of variation (sample std / mean); nan with fewer than two values."""
    values = [v for v in values if v == v]
    if len(values) < 2 or not statistics.fmean(values):
        return math.nan
    return statistics.stdev(values) / statistics.fmean(values)


def range_share(values: list[float]) -> float:
    """(max − min) / mean; nan with fewer than two values."""
    values = [v for v in values if v == v]
    if len(values) < 2 or not statistics.fmean(values):
        return math.nan
    return (max(values) - min(values)) / statistics.fmean(values)


def of_series(values: list[float], what: str = "windows") -> str:
    """'' for a steady series (bench's, explain's windows), else 'noisy: <what> vary N% (CV)'."""
    spread = cv(values)
    return f"noisy: {what} vary {spread:.0%} (CV)" if spread > LIMIT else ""


def of_seeds(seeds: list[dict]) -> str:
    """'' for a steady variant, else 'noisy: <why>' from its seeds' results (``epoch_cv``,
    ``images_per_second``, ``disturbed_epochs``, ``seed``); a seed without ``epoch_cv`` (an
    older model file) is judged by the rest."""
    reasons = []
    worst = max(seeds, key=lambda s: _num(s.get("epoch_cv")), default=None)
    if worst is not None and _num(worst.get("epoch_cv")) > LIMIT:
        reasons.append(f"epochs vary {worst['epoch_cv']:.0%} (CV, seed {worst.get('seed', '?')})")
    apart = range_share(
        [float(s["images_per_second"]) for s in seeds if s.get("images_per_second") is not None]
    )
    if apart > LIMIT:
        reasons.append(f"seeds' images/s differ {apart:.0%}")
    disturbed = sum(int(s.get("disturbed_epochs") or 0) for s in seeds)
    if disturbed:
        reasons.append(f"a slow MLflow store overlapped {disturbed} timed epoch(s)")
    return "noisy: " + "; ".join(reasons) if reasons else ""


def _num(value) -> float:
    """A number to compare; -inf for a missing or NaN one."""
    return float(value) if isinstance(value, (int, float)) and value == value else -math.inf
