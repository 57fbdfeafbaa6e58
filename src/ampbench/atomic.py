"""Files written whole or not at all: a temp file beside the target (named after its writer),
fsync, rename, fsync of the folder. A kill at any moment leaves the previous file or the new one,
never a torn file; temps of writers that died are removed by the next writer. Checkpoints
(checkpoints/files.py) and the prepared data set (data/) are written this way.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import torch

from ampbench import interrupts
from ampbench.processes import alive


def temp_name(path: Path, kind: str = "tmp") -> str:
    """`.<name>.<kind>-<pid>`: hidden, next to `path`, and naming its writer (see remove_stale_temps)."""
    return f".{path.name}.{kind}-{os.getpid()}"


def remove_stale_temps(path: Path, kind: str = "tmp") -> None:
    """Remove the `temp_name(path, kind)*` files or folders of writers that died (kill -9).

    A live writer's (another process's) temp is left alone, so two writers do not break each other;
    a name without a pid (older versions' naming) counts as stale.
    """
    for stale in path.parent.glob(f".{path.name}.{kind}-*"):
        pid = re.match(r"(\d+)(?:-|$)", stale.name.rsplit(f".{kind}-", 1)[1])
        if pid and int(pid[1]) != os.getpid() and alive(int(pid[1])):
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def atomic_save(obj: object, path: Path) -> None:
    """torch.save to a temp file beside `path`, fsync, rename, fsync the folder; raises OSError.

    A reader sees the old file or the new one, never a torn one; a failed write leaves no temp file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(temp_name(path))
    try:
        # A Ctrl-C waits to the rename: torch's writer calls write() from C++, and a second Ctrl-C
        # (a stop at once) that came during the save would end the process with the file written
        # but not renamed (final pass G: the stop checkpoint lost, a 186 MB temp file left).
        with interrupts.held():
            with open(tmp, "wb") as f:
                try:
                    torch.save(obj, f)
                except RuntimeError as err:  # torch's own writer hides ENOSPC: see _full
                    if _full(tmp):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
                    raise
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # make the rename itself durable
            finally:
                os.close(dir_fd)
    except BaseException:  # also Ctrl-C or a serializer error mid-write: no temp file left
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`text` to `path` through a temp file and a rename: never in place. A DVC output checked out
    as a hard link into DVC's cache (cache type hardlink) would otherwise be written through the
    link into the cache itself (final pass L: source.json and the digest rewritten inside
    .dvc/cache, which then no longer matched their names, and `dvc repro` could not recover)."""
    tmp = path.with_name(temp_name(path))
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# Less than this left after a failed write (the partial temp file still there) means it failed for
# want of space: a filesystem block or two, plus slack for what other writers took meanwhile.
FULL_MARGIN = 1 << 20


def _full(tmp: Path) -> bool:
    """Whether the filesystem holding `tmp` is (nearly) full.

    torch.save's zip writer reports a failed write as `RuntimeError: [enforce fail at
    inline_container.cc:...] . unexpected pos ...` or `PytorchStreamWriter failed writing file`,
    with no errno; a full filesystem is then what is left to check. Root may also use the blocks
    reserved for it, so its limit is the free blocks, everyone else's the available ones.
    """
    try:
        st = os.statvfs(tmp.parent)
    except OSError:
        return False
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize < FULL_MARGIN
