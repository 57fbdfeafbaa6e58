"""The data package's one error, and what its messages share: sizes, the no-space line.

``DataError``'s message says what went wrong, where, and how to fix it, in one line.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


class DataError(Exception):
    """Bad data source or archive; the message says what, where and how to fix."""


def no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def no_space_message(written: Path, final: Path) -> str:
    free_mib = shutil.disk_usage(final.parent).free / 2**20
    return (
        f"No space left on device: could not write {written} ({free_mib:.1f} MiB free there); free "
        f"space on that filesystem, or point {final.parent} elsewhere (a symlink to a larger disk), "
        "then re-run `ampbench download`"
    )


def size_text(n: float) -> str:
    """Bytes as people read them: 12 B, 3.4 KiB, 163.0 MiB, 256.0 GiB."""
    units, power = ("B", "KiB", "MiB", "GiB"), 0
    while n >= 1024 and power < len(units) - 1:
        n, power = n / 1024, power + 1
    return f"{n:.0f} B" if power == 0 else f"{n:.1f} {units[power]}"
