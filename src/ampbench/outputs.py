"""A stage's report files all or nothing: written into a staging folder, then moved into place.

    with outputs.staged(REPORTS_DIR, whole=("answer", "views")) as staging:
        write everything under staging/ (as if it were reports/)

Only when the block ends without an error do the staged files replace their namesakes under the
root (folders merged file by file, except those named in ``whole``, which replace the old folder
entirely); on an error nothing under the root changes and the staging folder is removed. The
moves are renames within one filesystem: a stage refused on its second variant, or killed while
writing, leaves the previous reports as they were, never half of them new.

The staging folder ``<root>/.staging-<pid>`` names its writer: one left by a killed stage is
removed by the next stage that stages there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

PREFIX = ".staging-"


@contextlib.contextmanager
def staged(root: Path, whole: tuple[str, ...] = ()) -> Iterator[Path]:
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{PREFIX}*"):
        pid = stale.name.removeprefix(PREFIX)
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):  # its writer is gone
            shutil.rmtree(stale, ignore_errors=True)
    staging = root / f"{PREFIX}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        _move_in(staging, root, whole)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT) and not err.filename:
            err.filename = f"{root}/"  # a writer that names no file (PIL's): the folder, at least
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_in(staging: Path, root: Path, whole: tuple[str, ...]) -> None:
    """Every staged file over its namesake under root; a `whole` folder replaces root's."""
    for name in whole:
        if (staging / name).is_dir():
            old = staging / f".old-{name}"
            with contextlib.suppress(FileNotFoundError):
                os.replace(root / name, old)
            os.replace(staging / name, root / name)
    for path in sorted(staging.rglob("*")):
        rel = path.relative_to(staging)
        if path.is_dir() or rel.parts[0].startswith(".old-"):
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, root / rel)
