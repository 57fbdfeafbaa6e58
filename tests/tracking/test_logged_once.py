"""A variant run's metrics: each key at each step once (hostile re-run: the variant run held the
mean test accuracy twice at the last step, the curve's point and the result, 24 ms apart)."""

from __future__ import annotations

from ampbench.tracking import evaluate_runs


class Recorder:
    def __init__(self) -> None:
        self.points: list[tuple[str, int]] = []

    def log_metrics(self, run_id, metrics, step=None, model_id=None) -> None:
        self.points += [(key, step or 0) for key in metrics]


def test_the_variant_runs_last_curve_point_is_not_logged_again_as_its_result():
    curves = [
        {
            "epoch": e,
            "seed": s,
            "train_loss": 1 / e,
            "train_accuracy": 0.5,
            "test_accuracy": 0.6 + e / 100 + s / 1000,
        }
        for e in (1, 2)
        for s in (0, 1)
    ]
    final = [0.6 + 2 / 100 + s / 1000 for s in (0, 1)]
    summary = {"test_accuracy": sum(final) / 2, "test_accuracy_std": 0.0007, "diverged_runs": 0}
    tracker = Recorder()
    evaluate_runs.log_aggregates(tracker, "run", summary, curves)
    twice = {p for p in tracker.points if tracker.points.count(p) > 1}
    assert not twice, twice
    assert ("test_accuracy", 2) in tracker.points and ("test_accuracy_std", 2) in tracker.points
