"""Which files of an ImageFolder split are images the download stage reads, and the ones it leaves out.

torchvision's ``make_dataset`` keeps the files whose suffix it is given and passes over the rest
without a word: a folder of BMP or TIFF images (a format torchvision's decoder does not read) would
have been prepared as a smaller data set, or an empty class, and the study run on it. The files left
out are counted and said, once per split, with an example and the fix.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

from ampbench.data.errors import DataError

log = logging.getLogger(__name__)

# What torchvision.io.decode_image reads as one RGB image (GIF may hold several frames: not here).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")


def samples(folder: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """(path, label) of every image under folder/<class>/, as make_dataset lists them; files left
    out (not hidden, not of IMAGE_EXTENSIONS) are said in one warning."""
    from torchvision.datasets.folder import make_dataset

    _refuse_linked_folders(folder, class_to_idx)
    found = make_dataset(str(folder), class_to_idx, extensions=IMAGE_EXTENSIONS)
    left_out = [
        path
        for name in class_to_idx
        for path in sorted((folder / name).rglob("*"))
        if path.is_file()
        and not path.name.startswith(".")
        and not path.name.lower().endswith(IMAGE_EXTENSIONS)
    ]
    if left_out:
        kinds = Counter(path.suffix.lower() or "(no suffix)" for path in left_out)
        log.warning(
            "%s: %d of its %d files are left out, as they are not PNG, JPEG or WebP images (%s; e.g. %s); "
            "convert them to PNG to include them",
            folder,
            len(left_out),
            len(left_out) + len(found),
            ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()),
            left_out[0].relative_to(folder),
        )
    return found


def _refuse_linked_folders(folder: Path, class_to_idx: dict[str, int]) -> None:
    """A link to a folder inside a class folder: make_dataset follows links (os.walk followlinks),
    so a link to `..` took every class's images into one, 40 times over, and two such links walked
    for minutes without a word (hostile pass E). Archives refuse links already (data/extract.py)."""
    for name in class_to_idx:
        for top, dirs, _ in os.walk(folder / name):  # links not followed: each is seen, none entered
            for entry in dirs:
                path = Path(top, entry)
                if path.is_symlink():
                    raise DataError(
                        f"{path} is a link to a folder ({os.readlink(path)}): the images of a class are "
                        "read from its own folder only; copy them in, or remove the link"
                    )


def check_classes(root: Path, train: set[str], test: set[str]) -> None:
    """train/ and test/ hold the same class folders, two or more: else a DataError naming the
    folders that differ (hostile pass WARN: "train has [10 names], test has [9]", not which)."""
    undecodable = sorted(n for n in train | test if any("\udc80" <= ch <= "\udcff" for ch in n))
    if undecodable:  # hostile pass D: torchvision's six-line cast error, then "re-save it"
        shown = undecodable[0].encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise DataError(
            f"{root}: the class folder name {shown!r} is not UTF-8 text (the names become the classes "
            "in the reports and MLflow): rename it in train/ and test/ to UTF-8 text"
        )
    controls = sorted(n for n in train | test if any(ord(ch) < 32 for ch in n))
    if controls:  # a newline in a class name splits report lines and MLflow's tables (hostile pass E)
        raise DataError(
            f"{root}: the class folder name {controls[0]!r} holds a control character (a newline, a tab): "
            "rename it in train/ and test/"
        )
    folded = sorted(n for n in train if sum(m.lower() == n.lower() for m in train) > 1)
    if folded:  # two classes a case-insensitive copy (a zip, a Mac) would merge: likely a mistake
        log.warning(
            "%s: class folders differ only by case: %s (kept apart, as named)", root, ", ".join(folded)
        )
    if not train and not test:
        raise DataError(
            f"{root}: train/ and test/ hold no class folders; put each class's images in "
            "train/<class>/ and test/<class>/"
        )
    if train != test:
        only = [
            f"only in {split}/: {', '.join(sorted(names))}"
            for split, names in (("train", train - test), ("test", test - train))
            if names
        ]
        raise DataError(
            f"{root}: train/ and test/ must hold the same class folders ({'; '.join(only)}); add the "
            "missing class folders, or remove the extra ones"
        )
    if len(train) < 2:  # one class: every prediction right, the accuracy meaningless (hostile pass WARN)
        raise DataError(
            f"{root}: holds one class ({', '.join(train)}); a classifier needs two or more class folders "
            "in train/ and test/"
        )
