"""Atomic checkpoints: a temp file in the same folder, fsync, rename.

A kill at any moment leaves either the previous checkpoint or the new one, never a torn file.
Checkpoints hold only tensors and plain Python values, so they load with ``weights_only=True``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or is not a plain-weights file."""


def save(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a writer killed with -9
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except BaseException as err:  # also Ctrl-C or a serializer error mid-write: no temp file left
        tmp.unlink(missing_ok=True)
        if not isinstance(err, OSError):
            raise
        hint = (
            " (disk full: free space, or run from a disk with room for checkpoints/ and models/)"
            if err.errno == errno.ENOSPC
            else ""
        )
        raise CheckpointError(f"could not write checkpoint {path}: {err.strerror}{hint}") from err


def load(path: Path, map_location: str | torch.device = "cpu") -> dict:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # pickle refusing non-weights objects, truncated zip, ...
        raise CheckpointError(
            f"{path} is not a readable plain-weights checkpoint ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); delete it and re-run training"
        ) from err
