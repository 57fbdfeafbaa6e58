"""One study, one configuration: the variants compared side by side must have been trained alike.

Each seed's line of an evaluate metrics file carries the settings its model was trained with
(``stages/evaluate.py`` CONFIG_KEYS, dotted keys such as ``train.epochs``, from the model file's own
config) and that config's digest (every setting that changes what training computes). Variants
differ by their parallel strategy and precision and by nothing else (neither is a setting: both
are the variant's name); a set whose settings differ in anything more (one variant retrained with
``train.epochs: 5`` after the others) would compare two studies. The dotted keys name what
differs; where none does but the digests do, the digest is named.
``compare`` refuses such a set with one line naming the key and the variants, or, with
``--allow-mixed``, labels the table with the same words instead.
"""

from __future__ import annotations

DIGEST = "config_digest"


class MixedSettingsError(ValueError):
    """Variants trained with different settings; says which and what to do."""


def differences(records: dict[str, dict]) -> list[str]:
    """Each setting that differs between the variants, as 'key: v1 (a, b) vs v2 (c)'; [] if none."""
    seeds = [seed for record in records.values() for seed in record.get("seeds", [])]
    settings = sorted({key for seed in seeds for key in seed if "." in key})
    return _differing(records, settings) or _differing(records, [DIGEST])


def _differing(records: dict[str, dict], keys: list[str]) -> list[str]:
    found = []
    for key in keys:
        values: dict[str, list[str]] = {}
        for variant, record in records.items():
            seen = {repr(seed.get(key)) for seed in record.get("seeds", []) if key in seed}
            for value in sorted(seen):
                values.setdefault(value, []).append(variant)
        if len(values) > 1:
            found.append(
                f"{key}: " + " vs ".join(f"{value} ({', '.join(names)})" for value, names in values.items())
            )
    return found


def check(records: dict[str, dict], allow_mixed: bool) -> str:
    """'' when every variant was trained alike; the label for the table when they were not and
    ``allow_mixed``; else raises MixedSettingsError (one line)."""
    found = differences(records)
    if not found:
        return ""
    said = "; ".join(found)
    if not allow_mixed:
        raise MixedSettingsError(
            f"the variants were trained with different settings ({said}), so their comparison would "
            "mix two studies; re-train the odd ones with the study's params.yaml (dvc repro), or pass "
            "--allow-mixed to compare them anyway, labelled"
        )
    return f"> **MIXED SETTINGS (--allow-mixed): not one study.** The variants were trained with: {said}."
