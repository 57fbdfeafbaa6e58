"""Checkpoints written beside training: a host snapshot at the epoch end, the write in a thread.

A checkpoint (model + momentum buffers: ~190 MB for the full AlexNet) written and fsync'd in the
training loop costs a large part of an epoch on a fast GPU. Here the loop only waits for the
snapshot: every tensor of the state is copied into host buffers (pinned on CUDA, reused from one
save to the next), and a background thread serialises it with ``checkpoint.save`` (temp file,
fsync, rename), while the next epoch trains.

At most one write is in flight: ``save`` first waits for the previous one, so the loop never
runs more than one epoch ahead of the disk, and ``wait`` (called before the seed ends, on errors
and on stop signals) joins it and re-raises its error. What a kill -9 can cost is therefore the
current epoch and, while the previous epoch's write is still in flight (a fraction of a second
after the epoch end), that epoch too: docs/RELIABILITY.md.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from ampbench import checkpoint


class CheckpointWriter:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: list[torch.Tensor | None] = []
        self.blocked_seconds = 0.0  # time the training loop spent in save() and wait()
        self.writes = 0

    def save(self, state: dict, path: Path, wait: bool = False) -> None:
        """Snapshot `state` (tensors anywhere in it) and write it to `path` in the background.

        ``wait``: also wait until it is on disk (stop signals, the last save of a run).
        """
        t0 = time.perf_counter()
        self._join()
        snapshot = self._snapshot(state)
        self._thread = threading.Thread(target=self._write, args=(snapshot, path), daemon=True,
                                        name="checkpoint-writer")  # fmt: skip
        self._thread.start()
        if wait:
            self._join()
        self.blocked_seconds += time.perf_counter() - t0

    def wait(self) -> None:
        """Until the write in flight (if any) is on disk; raises its CheckpointError."""
        t0 = time.perf_counter()
        try:
            self._join()
        finally:
            self.blocked_seconds += time.perf_counter() - t0

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _write(self, snapshot: dict, path: Path) -> None:
        try:
            checkpoint.save(snapshot, path)
            self.writes += 1
        except BaseException as err:  # re-raised in the training thread by the next save/wait
            self._error = err

    def _snapshot(self, state: dict) -> dict:
        """A copy of `state` whose tensors live in this writer's host buffers (reused when shapes match)."""
        leaves, spec = pytree.tree_flatten(state)
        if len(self._buffers) != len(leaves):
            self._buffers = [None] * len(leaves)
        copied, cuda = [], False
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                copied.append(leaf)
                continue
            buf = self._buffers[i]
            if buf is None or buf.shape != leaf.shape or buf.dtype != leaf.dtype:
                buf = torch.empty(leaf.shape, dtype=leaf.dtype, pin_memory=leaf.is_cuda)
                self._buffers[i] = buf
            buf.copy_(leaf.detach(), non_blocking=leaf.is_cuda)
            cuda = cuda or leaf.is_cuda
            copied.append(buf)
        if cuda:
            torch.cuda.synchronize()  # the non-blocking copies have landed before the thread reads
        return pytree.tree_unflatten(copied, spec)
