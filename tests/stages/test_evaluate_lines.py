"""What evaluate says of each variant as it ends."""

from __future__ import annotations

from ampbench.stages import evaluate_main


def test_one_seed_is_said_without_a_spread():
    """Hostile pass Z: the quick `mlflow run` said "test accuracy 0.5000 ± 0.0000 over 1 seeds"."""
    one = {"test_accuracy": 0.5, "test_accuracy_std": 0.0, "seeds": [{}]}
    assert evaluate_main._accuracy_said(one) == "0.5000 (one seed: no spread)"
    three = {"test_accuracy": 0.84521, "test_accuracy_std": 0.00132, "seeds": [{}, {}, {}]}
    assert evaluate_main._accuracy_said(three) == "0.8452 ± 0.0013 over 3 seeds"
