"""`ampbench estimate`: time a few steps of the real model here, and say how long the study takes.

    ampbench estimate            # on a CUDA machine it only says so, unless --force

The work is training/progress.py's ``preflight`` (the same estimate `make run` prints first).
"""

from __future__ import annotations

import argparse

from ampbench.config import Config


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("--force", action="store_true", help="estimate on the CPU even when CUDA is present")


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.commands import source_count
    from ampbench.data.fetch import CIFAR10_URL
    from ampbench.training import progress

    sizes = prepared_sizes(cfg) or source_count.image_counts(
        cfg.data.url, cfg.data.train_per_class, cfg.data.test_per_class
    )
    from ampbench.cli import all_overrides

    # the variants as the command narrows them (hostile pass J: `--set variants.*` ignored)
    overrides = all_overrides(args)
    estimated = progress.preflight(cfg, args.params, force=args.force, sizes=sizes, overrides=overrides)
    if estimated and sizes is None and cfg.data.url != CIFAR10_URL:
        # hostile pass G: "about 11 h" for a study of 300 images (4 min), without a word
        print(
            "Your data set (data.url) is not prepared yet: this counts CIFAR-10's 50,000 train "
            "images; each train stage logs its own estimate once it has the data.",
            flush=True,
        )
    return 0


def prepared_sizes(cfg: Config) -> tuple[int, int] | None:
    """(train, test) images of data/prepared where it was made with these settings (an image
    folder, a subset): the study trains on those, not on CIFAR-10's 50,000 and 10,000; else None."""
    from ampbench.data import prepared
    from ampbench.paths import DATA_FILE
    from ampbench.stages.download import SOURCE_FILE, prepared_mismatch

    if not (DATA_FILE.is_file() and SOURCE_FILE.is_file()) or prepared_mismatch(cfg):
        return None
    try:
        data = prepared.load_dataset(DATA_FILE)  # mapped: only the shapes are read
    except prepared.DataError:
        return None
    return len(data["train_labels"]), len(data["test_labels"])
