"""Atomic checkpoints (``ampbench.atomic``: a temp file in the same folder, fsync, rename), with
the errors a user can act on: a full disk, a file that is not plain weights.

Checkpoints hold only tensors and plain Python values, so they load with ``weights_only=True``.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import torch

from ampbench.atomic import atomic_save
from ampbench.chains import reason


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or is not a plain-weights file."""


def save(obj: dict, path: Path) -> None:
    try:
        atomic_save(obj, path)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(path.parent).free
            raise CheckpointError(
                f"{os.strerror(err.errno)}: could not write checkpoint {path} ({free / 2**20:.1f} MiB free "
                f"there); free space on that filesystem, or point {path.parent} elsewhere (a symlink to a "
                "larger disk), then re-run the same command (any previous checkpoint is intact)"
            ) from err
        raise CheckpointError(f"could not write checkpoint {path}: {err.strerror}") from err


def load(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict:
    """`path`'s plain weights; ``mmap``: tensors stay in the file, mapped, read only where used
    (a look at a model's settings reads its few kB of metadata, not its 90 MB of weights)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as err:  # pickle refusing non-weights objects, truncated zip, ...
        raise CheckpointError(
            f"{path} is not a readable plain-weights checkpoint ({type(err).__name__}: {reason(err)}); "
            "delete it and re-run training"
        ) from err
