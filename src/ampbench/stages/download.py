"""Stage `download`: fetch and prepare CIFAR-10 (``data.url``) into ``data/prepared/``.

    ampbench download

Beside the prepared file it records the data settings it was made from (``source.json``); the
train and evaluate stages refuse data prepared from settings other than those configured
(``check_prepared``): their runs would log data params that did not make the data.
"""

from __future__ import annotations

import json

from ampbench.config import Config, ConfigError
from ampbench.config.strict import shown
from ampbench.paths import DATA_FILE, RAW_DIR, SOURCE_FILE, TRAIN_LOCK, WORK_DIR
from ampbench.tracking.faults import lock_pids


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.data import prepared

    if not DATA_FILE.exists() or prepared_mismatch(cfg):
        _refuse_while_trained()
    d = cfg.data
    summary = prepared.prepare(
        d.url,
        DATA_FILE,
        RAW_DIR,
        sha256=d.sha256,
        retries=d.retries,
        timeout_s=d.timeout_s,
        min_rate_kib_s=d.min_rate_kib_s,
        train_per_class=d.train_per_class,
        test_per_class=d.test_per_class,
        image_size=d.image_size,
    )
    made = {**data_source(cfg), "num_classes": len(summary["classes"])}  # a fact, not a setting
    from ampbench import atomic  # torch: not for the light commands that check the prepared data

    atomic.atomic_write_text(SOURCE_FILE, json.dumps(made, indent=1) + "\n")  # never through DVC's link
    return 0


def _refuse_while_trained() -> None:
    """New data is not made while a trainer of this project reads the old (hostile pass I: a quick
    `mlflow run` re-prepared it under a training, whose models then met other data in evaluate).
    Its lock's holders are read from /proc/locks: a probe of the lock could refuse a trainer starting."""
    for lock in sorted(WORK_DIR.glob(f"*/{TRAIN_LOCK}")):
        if pids := lock_pids(lock):
            raise ConfigError(
                f"{DATA_FILE.parent} is in use: {lock.parent.name} is being trained from it by pid "
                f"{', '.join(map(str, pids))}, and new data would change under it: wait for it or end it "
                f"(kill {' '.join(map(str, pids))}), then run the same command again"
            )


def data_source(cfg: Config) -> dict:
    """The data settings that decide what the prepared file holds (logged as params too)."""
    d = cfg.data
    return {
        "data.url": d.url,
        "data.sha256": d.sha256,
        "data.train_per_class": d.train_per_class,
        "data.test_per_class": d.test_per_class,
        "data.image_size": d.image_size,
    }


# Settings added after files were prepared, with the value such a file was made with.
_ADDED_LATER = {"data.image_size": 32}


def prepared_mismatch(cfg: Config) -> list[str]:
    """Settings whose value differs from what data/prepared was made from (empty: consistent)."""
    if not SOURCE_FILE.exists():
        return []  # prepared by hand or by an older version: nothing to compare
    made = json.loads(SOURCE_FILE.read_text(encoding="utf-8"))
    return [
        f"{k}: prepared from {shown(made.get(k, _ADDED_LATER.get(k)))}, configured {shown(v)}"
        for k, v in data_source(cfg).items()
        if made.get(k, _ADDED_LATER.get(k)) != v
    ]


def check_prepared(cfg: Config) -> None:
    """Refuse to train or evaluate on data other than the params say (the run would log wrong params),
    or on none (hostile pass: `ampbench evaluate` before any download said "[Errno 2] No such file
    or directory: 'data/prepared/cifar10.pt'", with no fix)."""
    wrong = prepared_mismatch(cfg)
    if wrong:
        raise ConfigError(
            f"{DATA_FILE} does not match the data settings ({'; '.join(wrong)}): run `ampbench download` "
            "(or `dvc repro`) with these settings first"
        )
    if not DATA_FILE.is_file():
        from ampbench.data.errors import DataError

        raise DataError(f"{DATA_FILE} not found; run `ampbench download` / `dvc repro download` first")
