"""What a mixed study's refusal and label name: every setting that differs, not the first kind."""

from __future__ import annotations

from ampbench.report import mixed


def _record(epochs: int, lr: float, digest: str) -> dict:
    seed = {"seed": 0, "train.epochs": epochs, mixed.DIGEST: digest}
    return {"seeds": [{**seed, mixed.SETTINGS: {"train.epochs": epochs, "train.lr": lr}}]}


def test_every_differing_setting_is_named_carried_or_not():
    """Hostile pass P: epochs and lr differed, and the refusal and the MIXED SETTINGS label named
    train.epochs alone (the digested settings were read only where no carried key differed)."""
    records = {"single-fp32": _record(2, 0.1, "a"), "single-autocast": _record(1, 0.2, "b")}
    assert mixed.differences(records) == [
        "train.epochs: 2 (single-fp32) vs 1 (single-autocast)",
        "train.lr: 0.1 (single-fp32) vs 0.2 (single-autocast)",
    ]
    label = mixed.check(records, allow_mixed=True)
    assert "train.epochs: 2" in label and "train.lr: 0.1" in label, label


def test_the_digest_is_named_only_where_no_setting_says_what_differs():
    records = {"single-fp32": _record(2, 0.1, "a"), "single-autocast": _record(2, 0.1, "b")}
    assert mixed.differences(records) == ["config_digest: 'a' (single-fp32) vs 'b' (single-autocast)"]
    same = {"single-fp32": _record(2, 0.1, "a"), "single-autocast": _record(2, 0.1, "a")}
    assert mixed.differences(same) == [] and mixed.check(same, allow_mixed=False) == ""
