"""`--set variants.parallel=[...]` / `variants.precision=[...]` choose the study's variants for the
command that takes them (final pass J: compare checked the override, then ranked the variants of
params.yaml: "the fastest, dp-autocast" under `--set variants.parallel=[single]`)."""

from __future__ import annotations

from ampbench.variants import study_variants
from conftest import REPO


def test_a_commands_variant_overrides_choose_its_study():
    params = REPO / "params.yaml"
    every = study_variants(params)
    assert len(every) == 9 and "dp-autocast" in every
    assert study_variants(params, ["variants.parallel=[single]"]) == [
        "single-fp32",
        "single-autocast",
        "single-autocast_gradscaler",
    ]
    both = ["variants.parallel=[single, ddp]", "variants.precision=[fp32]", "train.epochs=1"]
    assert study_variants(params, both) == ["single-fp32", "ddp-fp32"]
