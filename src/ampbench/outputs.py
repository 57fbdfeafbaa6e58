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

from ampbench.paths import cannot_hold, unreplaceable, unwritable

PREFIX = ".staging-"
REPORT_SUFFIXES = (".json", ".md", ".csv", ".png", ".tsv", ".txt")


class OutputsError(ValueError):
    """A stage's output folder cannot take its files (one line: which folder, why, the fix)."""


def check_writable(root: Path, folders: tuple[str, ...] = ()) -> None:
    """``root`` and every folder under it take new files (``paths.unreplaceable``'s probes), and
    none of `folders` (relative to root, those the stage writes into) is a file, or OutputsError: a
    read-only or foreign-owned reports folder is refused before the stage's work, not when its
    files move into place."""
    if root.is_symlink() and not root.exists():  # final pass L: mkdir's FileExistsError traceback
        target = os.readlink(root)
        raise OutputsError(
            f"{root} is a link to {target}, which does not exist: make that folder (`mkdir -p {target}`) "
            "or remove the link, then re-run"
        )
    for folder in folders:
        for part in (*Path(folder).parents[::-1][1:], Path(folder)):  # plots, then plots/curves
            if (root / part).exists() and not (root / part).is_dir():
                raise OutputsError(
                    f"{root / part} is a file where a folder of reports goes: move it away "
                    f"(`mv {root / part} {root / part}.old`), then re-run"
                )
    refused = unreplaceable(root) if root.is_dir() else None
    if refused is None and (reason := unwritable(root)):
        refused = (root, reason)
    if refused:
        raise OutputsError(cannot_hold(refused[0], "reports", refused[1]))
    if root.is_dir() and (folder := next(_folders_named_as_files(root), None)):
        raise OutputsError(
            f"{folder} is a folder where a report file goes: remove it (`rm -r {folder}`), then re-run"
        )


def _folders_named_as_files(root: Path) -> Iterator[Path]:
    """Folders under root named as the report files are (a.json, comparison.md): a report's
    folders never carry a suffix, so each is in a file's place (and its move in would fail)."""
    for here, folders, _ in os.walk(root):
        for name in folders:
            if Path(name).suffix in REPORT_SUFFIXES and not name.startswith("."):
                yield Path(here) / name


def check_folder(folder: Path, holds: str) -> None:
    """``folder`` (made if missing) can take new files, or OutputsError: a command's report is
    refused before its measurement, not after it."""
    if reason := unwritable(folder):
        raise OutputsError(cannot_hold(folder, holds, reason))


def report_prefix(out: str, holds: str) -> Path:
    """``--out`` of bench and explain, a prefix of file names (reports/bench: .md, .json), checked
    before the measurement (hostile pass R: `--out ""` measured for 50 s, then "PosixPath('.') has
    an empty name"; `--out some/folder/` wrote some/folder.json beside it)."""
    if not out.strip() or out.endswith("/") or Path(out).is_dir():
        raise OutputsError(
            f"--out {out!r} names no file: give the {holds}'s file name prefix, e.g. --out "
            "reports/mine (writes reports/mine.md, .json)"
        )
    check_folder(Path(out).parent, holds)
    return Path(out)


@contextlib.contextmanager
def staged(root: Path, whole: tuple[str, ...] = (), folders: tuple[str, ...] = ()) -> Iterator[Path]:
    check_writable(root, (*whole, *folders))
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
        _name_the_output(err, staging, root)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _name_the_output(err: OSError, staging: Path, root: Path) -> None:
    """The error names the output under root, not the staging folder that is removed: a move's
    destination, a staged path as its namesake; a writer that names no file (PIL's), the root."""
    if err.filename2:  # a move: what refused it is its destination (a folder in a file's place)
        err.filename, err.filename2 = err.filename2, None
    elif err.filename and Path(err.filename).is_relative_to(staging):
        err.filename = str(root / Path(err.filename).relative_to(staging))
    elif err.errno in (errno.ENOSPC, errno.EDQUOT) and not err.filename:
        err.filename = f"{root}/"


def _move_in(staging: Path, root: Path, whole: tuple[str, ...]) -> None:
    """Every staged file over its namesake under root; a `whole` folder replaces root's."""
    for name in whole:
        if (root / name).is_symlink() and (root / name).is_dir():
            _clear_linked(root / name, staging / name)  # keep the user's link: files move in below
        elif (staging / name).is_dir():
            old = staging / f".old-{name}"
            with contextlib.suppress(FileNotFoundError):
                os.replace(root / name, old)
            os.replace(staging / name, root / name)
    for path in sorted(staging.rglob("*")):
        rel = path.relative_to(staging)
        if path.is_dir() or rel.parts[0].startswith(".old-"):
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        _replace(path, root / rel)


def _clear_linked(linked: Path, staged_folder: Path) -> None:
    """A ``whole`` folder that is a link (reports/answer on another disk): its files that the
    staged folder has not are removed, the link and its target kept (hostile re-run: compare
    replaced the link by a real folder, leaving the target empty and stale)."""
    for old in linked.rglob("*"):
        if old.is_file() and not (staged_folder / old.relative_to(linked)).exists():
            old.unlink()


def _replace(path: Path, target: Path) -> None:
    """``path`` over ``target`` at once; where target's folder is on another filesystem (a
    reports/metrics that is a link to another disk: rename cannot cross, EXDEV), a copy beside
    it first, then the rename within that filesystem: still never a half-written report."""
    try:
        os.replace(path, target)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        copy = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(path, copy)
            os.replace(copy, target)
        finally:
            copy.unlink(missing_ok=True)
