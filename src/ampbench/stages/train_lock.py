"""One trainer per variant: an exclusive lock in the variant's work folder, held for the stage's life.

Two `ampbench train` of the same variant at once (a second terminal, `dvc queue` with two jobs, a
re-run while an orphan of a killed job still trains) would write the same checkpoints and send
the same epochs to the same MLflow runs. The second is refused at once, with one line:
"<variant> is being trained by pid N: wait for it or end it (kill N)".

- ``hold``: ``fcntl.flock(LOCK_EX)`` on ``checkpoints/<variant>/.train.lock``, taken by the process
  that trains (single, dp), by the DDP launcher (`ampbench train --parallel ddp`), or by rank 0
  under an outer torchrun. The kernel drops the lock when its holder dies, kill -9 too: a lock is
  never stale. The holder removes the file when it ends (a new one is made by the next stage).
- ``join``: the DDP launcher's workers share ``.workers.lock`` (``LOCK_SH``); the launcher checks
  that no worker holds it, so workers orphaned by a killed launcher (they stop within a second,
  stages/stop.py, but save first) keep a new launcher out until they have ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ampbench.paths import MODELS_DIR, TRAIN_LOCK, cannot_hold, dvc_recorded, unwritable
from ampbench.tracking.faults import lock_pids

LOCK, WORKERS = TRAIN_LOCK, ".workers.lock"
LAUNCHER_ENV = "AMPBENCH_TRAIN_LAUNCHER"  # set by the DDP launcher for its workers: its pid


class TrainingBusyError(RuntimeError):
    """Another process trains this variant; names it and how to end it."""


def _busy(variant: str, path: Path, pids: list[int]) -> TrainingBusyError:
    if not pids:  # no /proc/locks: the holder wrote its pid into the file
        with contextlib.suppress(OSError, ValueError):
            pids = [int(path.read_text(encoding="utf-8").split()[0])]
    who = ", ".join(map(str, pids)) or "another process"
    kill = f"kill {' '.join(map(str, pids))}" if pids else f"`fuser {path}` names it"
    said = f"{variant} is being trained by pid {who}: wait for it or end it ({kill})"
    return TrainingBusyError(said + _removed_by_dvc(variant))


def _removed_by_dvc(variant: str) -> str:
    """What brings back the models a plain `dvc repro` removed before this refused stage began
    (hostile pass Y; the pipeline command refuses before DVC runs, dvc_guard.trainer_fault)."""
    published = MODELS_DIR / variant
    stage = os.environ.get("DVC_STAGE")
    if not stage or published.exists() or published.as_posix() not in dvc_recorded(stage):
        return ""
    return (
        f". DVC removed {published.as_posix()}/ as this stage began: until that training publishes its "
        f"own, `dvc checkout {published.as_posix()}` brings back the one dvc.lock records"
    )


def _write_pid(fd: int, path: Path) -> None:
    """This process's pid into the lock file (what a refused second trainer names); a full disk
    names the file (a bare os.write error names none)."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err


def _open_locked(path: Path, mode: int) -> int | None:
    """A descriptor of ``path`` locked with ``mode``, or None if another process holds it. Retries
    when the file was removed (by an ending holder) between the open and the lock."""
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the folder was removed meanwhile (a stage publishing)
            continue
        except OSError as err:  # a file in the folder's place, a folder this user cannot write
            raise _unwritable(path.parent, err) from None
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)  # locked a file that is no longer there: lock the one that is


def _unwritable(folder: Path, err: OSError):
    """The one line ``checkpoints.work.check_writable`` gives, for the lock's folder (changed after
    that check, or a path it does not see)."""
    from ampbench.checkpoints.files import CheckpointError  # torch: only on this path

    reason = unwritable(folder) or err.strerror or type(err).__name__
    return CheckpointError(cannot_hold(folder, "work in progress (checkpoints)", reason))


def _release(fd: int, path: Path) -> None:
    """Remove the lock file (still ours: the same inode), then the folders it leaves empty."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    os.close(fd)
    for folder in (path.parent, path.parent.parent):  # checkpoints/<variant>/, checkpoints/
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty


@contextlib.contextmanager
def hold(work: Path, variant: str) -> Iterator[None]:
    """This process is the variant's one trainer until the block ends; else TrainingBusyError."""
    path = work / LOCK
    fd = _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        raise _busy(variant, path, lock_pids(path))
    try:
        _write_pid(fd, path)
        orphans = _clear_workers(work)  # of a DDP launcher that died (kill -9): they may be saving
        if orphans is not None:
            raise _busy(variant, work / WORKERS, orphans)
        yield
    finally:
        _clear_workers(work)
        _release(fd, path)


def _clear_workers(work: Path) -> list[int] | None:
    """Remove the workers' lock file if no worker holds it (None); else the pids that hold it."""
    path = work / WORKERS
    if not path.exists():
        return None
    probe = _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if probe is None:
        return lock_pids(path)
    _release(probe, path)
    return None


def _alive(pid: int) -> bool:
    """``pid`` runs (not a zombie). Not ``os.getppid() == pid``: under a warm server (make run) a
    worker is a fork of the server, not a child of its launcher."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def join(work: Path, launcher: int) -> Iterator[None]:
    """A DDP worker of the launcher ``launcher`` (which holds the variant's lock) trains under it."""
    path = work / WORKERS
    fd = _open_locked(path, fcntl.LOCK_SH)  # blocking: a launcher's probe lasts microseconds
    try:
        if not _alive(launcher):  # it died before this worker joined: a new launcher may be running
            raise TrainingBusyError(f"the DDP launcher (pid {launcher}) is gone: this worker trains nothing")
        yield
    finally:
        os.close(fd)


def for_this_process(work: Path, variant: str):
    """The lock this process trains under: its own, or (a DDP worker) its launcher's."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if "RANK" in os.environ and launcher:
        return join(work, int(launcher))
    if os.environ.get("RANK", "0") == "0":  # a plain stage, or rank 0 under an outer torchrun
        return hold(work, variant)
    return contextlib.nullcontext()
