"""Where the stages read and write, relative to the project root (dvc.yaml names the same paths)."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

DATA_FILE = Path("data/prepared/cifar10.pt")
SOURCE_FILE = DATA_FILE.with_name("source.json")  # the data settings DATA_FILE was made from
RAW_DIR = Path("data/raw")
MODELS_DIR = Path("models")
WORK_DIR = Path("checkpoints")  # in-progress seeds: checkpoints, finished models (no DVC output)
TRAIN_LOCK = ".train.lock"  # in WORK_DIR/<variant>/, held by its one trainer (stages/train_lock.py)
REPORTS_DIR = Path("reports")
# DVC runs a queued experiment (`dvc exp run --queue`, `--temp`) in a copy of the repository under
# <repo>/.dvc/tmp/exps/<tmp>/ and deletes that copy when the experiment ends, fails or is killed.
DVC_TEMP_WORKSPACE = (".dvc", "tmp", "exps")


def temp_workspace_root(cwd: Path | None = None) -> Path | None:
    """The repository whose DVC temporary workspace `cwd` is in, else None."""
    parts = (cwd or Path.cwd()).resolve().parts
    n = len(DVC_TEMP_WORKSPACE)
    for i in range(len(parts) - n, 0, -1):
        if parts[i : i + n] == DVC_TEMP_WORKSPACE:
            return Path(*parts[:i])
    return None


def work_root(digest: str, cwd: Path | None = None) -> Path:
    """Where a train stage keeps its work in progress: checkpoints/, or, in a DVC temporary
    workspace, the repository's own checkpoints/queued/<settings digest>/, which outlives the copy:
    a killed queued experiment queued again resumes (its settings, so its digest, are the same),
    and experiments of other settings never meet each other's checkpoints."""
    repo = temp_workspace_root(cwd)
    return WORK_DIR if repo is None else repo / WORK_DIR / "queued" / digest


def unwritable(folder: Path) -> str | None:
    """Why `folder` cannot be made or take new files, or None if it can: a probe file is written
    into its nearest existing folder and removed (nothing else is created). A read-only or
    foreign-owned folder, a file in a folder's place, a read-only filesystem all show here, also
    to root, whom permission bits do not stop (an immutable folder does)."""
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == Path(p.anchor))
    probe = existing / f".write-check-{os.getpid()}"
    try:
        if not existing.is_dir():
            return f"{existing} is a file"
        probe.write_bytes(b"")
        probe.unlink()
    except PermissionError as err:
        if err.errno == errno.EPERM:  # not EACCES: no permission bit refused it, a file attribute did
            return (
                f"{err.strerror}: {existing} may be immutable or append-only (`lsattr -d {existing}` "
                f"shows an i or an a; `sudo chattr -i -a {existing}` clears them)"
            )
        return err.strerror or type(err).__name__
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


READ_ONLY = os.strerror(errno.EROFS)  # `unwritable`'s reason on a read-only mount


def remount(path: Path) -> str:
    """The fix for a read-only mount, which no chmod, chown or rm changes (hostile pass B7)."""
    return f"mount its filesystem writable (`findmnt -T {path}` names the mount)"


def cannot_hold(folder: Path, holds: str, reason: str) -> str:
    """The one line for a folder a stage must write into that `unwritable` refused."""
    fix = (
        remount(folder)
        if reason == READ_ONLY
        else "make it a folder this user can write to (or remove what is in its place)"
    )
    return f"{folder}/ cannot hold the {holds} ({reason}): {fix}, then re-run"


def unreplaceable(folder: Path) -> tuple[Path, str] | None:
    """The first folder in the tree of `folder` (itself included) where this user cannot remove or
    add entries, with why; None if `folder` and all its subfolders let them. What `rm -r` of it, or
    replacing it, needs: a `sudo` run's root-owned seed folder inside the user's own folder shows
    here, not half-way through the replacement."""
    refused: list[tuple[Path, str]] = []

    def unlistable(err: OSError) -> None:
        refused.append((Path(err.filename or folder), err.strerror or type(err).__name__))

    for here, _, _ in os.walk(folder, onerror=unlistable):
        reason = unwritable(Path(here))
        if reason:
            return Path(here), reason
        if refused:
            break
    return refused[0] if refused else None


def unreadable_folder(cwd: str | None = None) -> str | None:
    """One line where the working folder's path holds bytes this locale cannot decode (a non-ASCII
    path under LANG=C): Python keeps them as lone surrogates, which SQLAlchemy, MLflow and the
    logs cannot encode, deep inside a stage."""
    cwd = os.getcwd() if cwd is None else cwd
    if not any("\udc80" <= ch <= "\udcff" for ch in cwd):
        return None
    shown = cwd.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    locale = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG") or "unset"
    return (
        f"the project folder {shown!r} has characters this locale (LANG/LC_ALL: {locale}) cannot "
        "read: run with a UTF-8 locale (`export LC_ALL=C.UTF-8`) or `PYTHONUTF8=1`, or move the "
        "project to a path of ASCII characters"
    )


def missing(path: Path) -> str:
    """Why `path` is not there, for "<path> missing...": where a folder on its way is a file
    (hostile re-run: reports/metrics as a file was reported as each variant's metrics missing)."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return f"missing: {parent} is a file, not a folder (move it away first)"
    return "missing"


def dvc_recorded(stage: str = "", lock: Path = Path("dvc.lock")) -> set[str]:
    """The outputs dvc.lock records (of ``stage`` alone, where given), as their paths: what `dvc
    checkout` can bring back; none where it records none or cannot be read (hostile pass Y: a
    refused download said "`dvc checkout download` puts them back" of a folder it never recorded)."""
    import yaml

    try:
        stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages") or {}
        named = [stages.get(stage) or {}] if stage else list(stages.values())
        return {str(out["path"]).rstrip("/") for entry in named for out in entry.get("outs") or []}
    except (OSError, yaml.YAMLError, AttributeError, TypeError, KeyError):
        return set()


def owned_by(path: Path) -> str:
    """' belongs to <user>' for a path another user owns (a `sudo` run's), else ''."""
    import pwd

    try:
        uid = path.stat().st_uid
    except OSError:
        return ""
    if uid == os.geteuid():
        return ""
    try:
        return f" belongs to {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f" belongs to uid {uid}"


MOUNTINFO = Path("/proc/self/mountinfo")  # the kernel's table of this process's mounts


def mount_point(path: Path) -> bool:
    """Whether ``path`` is a mount point: a bind mount of a folder of the same filesystem too, which
    ``os.path.ismount`` (device numbers) misses (hostile pass E9). Mount points are the table's 5th
    field, with space, tab, newline and backslash written as octal escapes."""
    if os.path.ismount(path):
        return True
    real = os.path.realpath(path)
    try:
        table = MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError:
        return False
    points = (line.split()[4] for line in table if len(line.split()) > 4)
    return any(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point) == real for point in points)
