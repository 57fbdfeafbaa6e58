"""`ampbench estimate`'s count of the images a local ImageFolder source (a folder, or a tar
archive of one) will give the study, from its file names, before the download stage has read it:
`make run DATA=<own data>` estimates the study on that data set, not on CIFAR-10's 60,000 images
(hostile passes: "about 1 d 2 h" for a study of 480 images that took 8 minutes).

Only names are read: a folder is listed, an archive's member names are read (its images are not
decoded). The CIFAR python format, URLs and anything unreadable give None: the caller counts
CIFAR-10's sizes, as the download stage will make them.
"""

from __future__ import annotations

import os
import tarfile
from collections import Counter
from pathlib import Path, PurePosixPath

from ampbench.data.image_files import IMAGE_EXTENSIONS

SPLITS = ("train", "test")


def image_counts(url: str, train_per_class: int = 0, test_per_class: int = 0) -> tuple[int, int] | None:
    """(train, test) images the download stage will prepare from a local ImageFolder source, its
    per-class subsets applied; None where this cannot be told from names alone."""
    path = Path(url.removeprefix("file://")).expanduser()
    try:
        if path.is_dir():
            names = [
                os.path.relpath(os.path.join(top, f), path) for top, _, files in os.walk(path) for f in files
            ]
        elif path.is_file() and tarfile.is_tarfile(path):
            with tarfile.open(path, "r:*") as tar:
                names = [m.name for m in tar if m.isfile()]
        else:
            return None
    except (OSError, tarfile.TarError, EOFError):
        return None
    per_class: dict[str, Counter] = {split: Counter() for split in SPLITS}
    for name in names:
        parts = PurePosixPath(name.replace(os.sep, "/")).parts
        for i, part in enumerate(parts[:-2]):  # .../<split>/<class>/<file>, at most 2 levels down
            if part in SPLITS and i <= 2 and len(parts) == i + 3:
                if parts[-1].lower().endswith(IMAGE_EXTENSIONS) and not parts[-1].startswith("."):
                    per_class[part][parts[i + 1]] += 1
                break
    if not per_class["train"] or not per_class["test"]:
        return None
    limit = {"train": train_per_class, "test": test_per_class}
    counts = [sum(min(n, limit[s]) if limit[s] else n for n in per_class[s].values()) for s in SPLITS]
    return counts[0], counts[1]
