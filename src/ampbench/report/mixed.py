"""One study, one configuration: the variants compared side by side must have been trained alike.

Each seed's line of an evaluate metrics file carries the settings its model was trained with
(``stages/evaluate.py`` CONFIG_KEYS, dotted keys such as ``train.epochs``, from the model file's own
config) and that config's digest (every setting that changes what training computes). Variants
differ by their parallel strategy and precision and by nothing else (neither is a setting: both
are the variant's name); a set whose settings differ in anything more (one variant retrained with
``train.epochs: 5`` after the others) would compare two studies. The dotted keys name what
differs, and after them the model file's other digested settings (``settings``: train.lr, model.*); where
none does (a metrics file older than those) but the digests do, the digest is named.
``compare`` refuses such a set with one line naming the key and the variants, or, with
``--allow-mixed``, labels the table with the same words instead.
"""

from __future__ import annotations

from ampbench.config.strict import shown

DIGEST = "config_digest"
SETTINGS = "settings"  # a seed's every digested setting, dotted keys (stages/evaluate.py)


class MixedSettingsError(ValueError):
    """Variants trained with different settings; says which and what to do."""


def differences(records: dict[str, dict]) -> list[str]:
    """Each setting that differs between the variants, as 'key: v1 (a, b) vs v2 (c)'; [] if none."""
    seeds = [seed for record in records.values() for seed in record.get("seeds", [])]
    carried = sorted({key for seed in seeds for key in seed if "." in key})
    others = sorted({key for seed in seeds for key in seed.get(SETTINGS, {})} - set(carried))
    # every differing key, the carried ones first (hostile pass P: the rest were named only where
    # no carried key differed, so a label listed train.epochs and left out train.lr)
    found = _differing(records, carried) + _differing(records, others, SETTINGS)
    return found or _differing(records, [DIGEST])


def _differing(records: dict[str, dict], keys: list[str], within: str = "") -> list[str]:
    """`keys` of each seed (or of its ``within`` dict) whose values differ between the variants."""
    found = []
    for key in keys:
        values: dict[str, list[str]] = {}
        for variant, record in records.items():
            rows = [seed.get(within, {}) if within else seed for seed in record.get("seeds", [])]
            seen = {shown(row.get(key)) for row in rows if key in row}
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
            "mix two studies; set params.yaml to the settings the study should have and run the "
            f"pipeline again (`make run` or `dvc repro`: it re-trains the variants trained otherwise)"
            f"{by_hand(records)}, or compare them anyway, the reports labelled as mixed: `ampbench "
            "evaluate --allow-mixed`, then `ampbench compare --allow-mixed`"
        )
    return f"> **MIXED SETTINGS (--allow-mixed): not one study.** The variants were trained with: {said}."


def since_trained(records: dict[str, dict], digest: str, settings: dict, overrides=()) -> str:
    """'' when the models were trained with the params' settings (``digest``, ``settings``: the
    config's ``digest()`` and ``digested()``); else one line saying what changed since (hostile pass
    D: params.yaml edited after the training, then evaluate and compare said nothing of it)."""
    seeds = [seed for record in records.values() for seed in record.get("seeds", [])]
    if all(seed.get(DIGEST) == digest for seed in seeds):
        return ""
    now, changed = _plain(settings), {}
    for seed in seeds:
        for key, value in _plain(seed.get(SETTINGS, {})).items():
            if key in now and now[key] != value:
                changed.setdefault(key, f"{key}: {shown(value)} -> {shown(now[key])}")
    what = "; ".join(changed[key] for key in sorted(changed)) or "its config digest differs"
    # hostile pass P: `evaluate --set train.seeds=[1]` was told params.yaml had changed
    given = {item.partition("=")[0].strip() for item in overrides}
    if given & set(changed):
        return (
            f"the settings given (--set) differ from those these models were trained with ({what}): the "
            "reports are of the models as trained"
        )
    # not "params.yaml has changed": a model trained with --set is as likely (hostile pass D8)
    return (
        f"these models were trained with other settings than params.yaml's ({what}): the reports are of "
        "the models as trained; `make run` (or `dvc repro`) trains them again with params.yaml"
        + by_hand(records)
    )


def by_hand(records: dict[str, dict]) -> str:
    """'' where the pipeline trains every variant of ``records``; else what trains the others
    (hostile pass D8: "`dvc repro` re-trains the variants trained otherwise", and single-tf32,
    in no stage of params.yaml's matrix, stayed as it was)."""
    from ampbench.variants import split_name, study_variants

    outside = [variant for variant in records if variant not in study_variants()]
    if not outside:
        return ""
    commands = ", ".join(  # then evaluate: its metrics file is what a report reads (pass H10)
        "`ampbench train --parallel {} --precision {}`".format(*split_name(variant)) for variant in outside
    )
    commands += f", then `ampbench evaluate --variants {','.join(outside)}`"
    return f" ({', '.join(outside)}: in no stage of params.yaml's `variants`, so by hand: {commands})"


def _plain(values: dict) -> dict:
    """As JSON holds them (tuples as lists): a model file's settings and the params' compare alike."""
    import json

    return json.loads(json.dumps(values, default=str))
