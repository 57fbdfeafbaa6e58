"""The measurement checks itself: a bimodal speed is flagged, a steady one is not."""

from __future__ import annotations

from ampbench.report import compare, selfcheck

# The study's AMP epochs of 2026-12-05 (thousands of images/s, H100): two speeds in one seed.
BIMODAL = [200, 238, 273, 328, 323, 319, 314, 231, 235, 238, 310, 322, 237, 260, 325, 322, 316, 316, 325, 327]
STEADY = [348.4, 349.1, 350.9, 348.7, 349.9, 348.6, 350.2]


def _seed(seed: int, epochs: list[float], **extra) -> dict:
    steady = [e * 1e3 for e in epochs[1:]]
    return {
        "seed": seed,
        "images_per_second": sum(steady) / len(steady),
        "epoch_cv": selfcheck.cv(steady),
        "test_accuracy": 0.85,
        "train_seconds": 3.0,
        "peak_memory_mb": 1000.0,
        "diverged": False,
        "devices_used": 1,
        **extra,
    }


def test_a_bimodal_series_is_noisy_and_a_steady_one_is_not():
    assert selfcheck.of_series([x * 1e3 for x in BIMODAL]).startswith("noisy: windows vary 1")
    assert selfcheck.of_series([x * 1e3 for x in STEADY]) == ""


def test_a_variant_with_bimodal_epochs_is_flagged_with_the_seed():
    verdict = selfcheck.of_seeds([_seed(0, STEADY), _seed(1, BIMODAL), _seed(2, STEADY)])
    assert verdict.startswith("noisy: epochs vary") and "seed 1" in verdict
    assert "seeds' images/s differ" in verdict  # seed 1's mean is ~15% below the others'


def test_steady_seeds_pass_and_seeds_apart_are_flagged():
    assert selfcheck.of_seeds([_seed(s, STEADY) for s in range(3)]) == ""
    slow = [x * 0.9 for x in STEADY]
    assert selfcheck.of_seeds([_seed(0, slow), _seed(1, STEADY)]) == "noisy: seeds' images/s differ 11%"
    assert "overlapped 2 timed" in selfcheck.of_seeds([_seed(0, STEADY, disturbed_epochs=2)])


def test_the_comparison_says_which_variant_is_noisy_and_why():
    records = {
        "single-fp32": {"seeds": [_seed(s, STEADY) for s in range(3)]},
        "single-autocast": {"seeds": [_seed(0, BIMODAL), _seed(1, STEADY), _seed(2, STEADY)]},
    }
    rows = compare.summarize(records)
    by = {r["variant"]: r for r in rows}
    assert by["single-fp32"]["noisy"] == "" and by["single-autocast"]["noisy"].startswith("noisy:")
    md = compare.to_markdown(rows)
    assert "Self-check: **single-autocast** noisy: epochs vary" in md
    steady = compare.to_markdown(compare.summarize({"single-fp32": records["single-fp32"]}))
    assert "Self-check: every variant steady" in steady
