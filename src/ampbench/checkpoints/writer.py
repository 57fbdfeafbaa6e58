"""Checkpoints written beside training, by a helper process, from a shared-memory snapshot.

A checkpoint (model + momentum buffers: ~190 MB for the full AlexNet) written and fsync'd in the
training loop costs a large part of an epoch on a fast GPU. Written by a thread of the training
process it costs even more: ``torch.save`` holds the GIL while it serialises, which starves the
loop that feeds the GPU (measured on an H200: single-autocast fell from 344k to 257k images/s).

So the loop only copies every tensor of the state into shared-memory files (``/dev/shm``, mapped
once, reused from one save to the next) and sends a small message to a writer process started with
the stage; that process builds the checkpoint from the same memory and writes it with
``files.save`` (temp file, fsync, rename). At most one write is in flight: ``save`` first
waits for the previous one's answer, and ``wait`` joins it and raises its error.

The writer runs in a session of its own and reads its instructions whole before writing, so a
kill -9 of the training process (or of its process group) does not stop a write in progress: the
checkpoint of the last finished epoch still lands, and a crash loses at most the current epoch.
The writer exits when told to stop, or when its pipe closes (the trainer is gone), and removes
the shared-memory files it mapped.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from ampbench.checkpoints import files

_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


@dataclass(frozen=True)
class _Slot:
    """Where a tensor of the state is, in the message: shared buffer `index`."""

    index: int


class CheckpointWriter:
    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buffers: list[torch.Tensor] = []
        self._specs: list[tuple[str, tuple, str]] = []
        self._inflight = False
        self._generation = 0  # in the shared files' names: a new layout never reuses a name
        self.blocked_seconds = 0.0  # time the training loop spent in save() and wait()
        self.writes = 0

    def start(self) -> None:
        """Start the writer process now (its imports then overlap the caller's set-up)."""
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:  # a dead writer: its replacement maps fresh buffers
                self._discard()
            # Through `ampbench`: a warm-start server forks the writer at once (ampbench.warm).
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ampbench", "checkpoint-writer"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )

    def save(self, state: dict, path: Path, wait: bool = False) -> None:
        """Snapshot `state` (tensors anywhere in it) and have it written to `path` in the background.

        ``wait``: also wait until it is on disk (stop signals).
        """
        t0 = time.perf_counter()
        try:
            self._join()
            self.start()
            skeleton = self._snapshot(state)
            self._send(("write", str(path), skeleton, self._specs))
            self._inflight = True
            if wait:
                self._join()
        finally:
            self.blocked_seconds += time.perf_counter() - t0

    def wait(self) -> None:
        """Until the write in flight (if any) is on disk; raises its CheckpointError."""
        t0 = time.perf_counter()
        try:
            self._join()
        finally:
            self.blocked_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Wait for the write in flight, stop the writer, remove the shared memory."""
        try:
            self.wait()
            if self._proc is not None and self._proc.poll() is None:
                # An explicit stop, not EOF alone: forked DataLoader workers hold the pipe open.
                self._send(("stop",))
                self._proc.stdin.close()
                self._proc.wait(timeout=60)
        except (files.CheckpointError, subprocess.TimeoutExpired):
            pass  # nothing is in flight any more: the writer may go
        finally:
            self._discard()

    def _discard(self) -> None:
        """Stop the writer process if it still runs, drop the buffers and their files."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
        self._proc, self._inflight = None, False
        for name, _, _ in self._specs:
            Path(name).unlink(missing_ok=True)
        self._buffers, self._specs = [], []

    def _send(self, message) -> None:
        try:
            pickle.dump(message, self._proc.stdin)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            self._discard()
            raise files.CheckpointError(f"the checkpoint writer process is gone ({err})") from None
        except BaseException:  # a partial message (Ctrl-C): the channel is unusable
            self._discard()
            raise

    def _join(self) -> None:
        if not self._inflight:
            return
        try:
            status, detail = pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as err:
            code = self._proc.poll()
            self._discard()
            raise files.CheckpointError(
                f"the checkpoint writer process died (exit code {code}, {err!r})"
            ) from None
        except BaseException:  # interrupted mid-answer: no way to tell which write it was
            self._discard()
            raise
        self._inflight = False
        if status != "ok":
            raise files.CheckpointError(detail)
        self.writes += 1

    def _snapshot(self, state: dict):
        """The state with its tensors copied into shared buffers and replaced by slots."""
        leaves, spec = pytree.tree_flatten(state)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        shapes = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors]
        if shapes != [(shape, dtype) for _, shape, dtype in self._specs]:
            self._allocate(shapes)
        cuda = False
        for buf, t in zip(self._buffers, tensors):
            buf.copy_(t.detach(), non_blocking=t.is_cuda)
            cuda = cuda or t.is_cuda
        if cuda:
            torch.cuda.synchronize()  # the copies have landed before the writer reads them
        slots, i = [], 0
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                slots.append(_Slot(i))
                i += 1
            else:
                slots.append(leaf)
        return pytree.tree_unflatten(slots, spec)

    def _allocate(self, shapes) -> None:
        for name, _, _ in self._specs:
            Path(name).unlink(missing_ok=True)
        self._buffers, self._specs = [], []
        self._generation += 1
        for i, (shape, dtype) in enumerate(shapes):
            name = os.path.join(_SHM, f"ampbench-ckpt-{os.getpid()}-{id(self)}-{self._generation}-{i}")
            Path(name).unlink(missing_ok=True)
            self._buffers.append(_mapped(name, shape, dtype, reserve=True))
            self._specs.append((name, shape, dtype))


def _mapped(name: str, shape: tuple, dtype: str, reserve: bool = False) -> torch.Tensor:
    """A tensor over the shared file `name`. ``reserve``: allocate its pages first, so that a full
    /dev/shm is an error here (CheckpointError) instead of a SIGBUS in the first copy."""
    numel = 1
    for n in shape:
        numel *= n
    dt = getattr(torch, dtype)
    if reserve:
        nbytes = max(1, numel) * torch.empty((), dtype=dt).element_size()
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError as err:
            Path(name).unlink(missing_ok=True)
            raise files.CheckpointError(
                f"no room for a checkpoint snapshot in {_SHM} ({err.strerror}: {nbytes / 2**20:.0f} MB "
                "needed); free space there or enlarge it (docker: --shm-size)"
            ) from None
    flat = torch.from_file(name, shared=True, size=max(1, numel), dtype=dt)
    return flat[:numel].view(shape)


def _serve(inp, out) -> None:
    """The writer process: one message at a time, each answered once its checkpoint is on disk."""
    mapped: dict[str, torch.Tensor] = {}
    names: set[str] = set()
    try:
        while True:
            try:
                message = pickle.load(inp)
            except EOFError:  # the trainer died (its pipe closed)
                return
            if message[0] == "stop":
                return
            _, path, skeleton, specs = message
            buffers = []
            for name, shape, dtype in specs:
                if name not in mapped:
                    mapped[name] = _mapped(name, shape, dtype)
                    names.add(name)
                buffers.append(mapped[name])
            leaves, spec = pytree.tree_flatten(skeleton)
            obj = pytree.tree_unflatten(
                [buffers[x.index] if isinstance(x, _Slot) else x for x in leaves], spec
            )
            try:
                files.save(obj, Path(path))
                answer = ("ok", "")
            except Exception as err:  # CheckpointError (disk full, ...) goes back to the trainer
                answer = ("error", str(err))
            try:
                pickle.dump(answer, out)
                out.flush()
            except (BrokenPipeError, OSError):  # the trainer is gone; its checkpoint is written
                return
    finally:
        for name in names:  # the trainer may be dead: the last user removes the shared files
            Path(name).unlink(missing_ok=True)


def serve_stdio() -> int:
    """The writer process's main (`ampbench checkpoint-writer`, started by CheckpointWriter.start).

    It competes with the training loop for the host's CPUs while it writes (an AMP epoch on an
    H200 lasts about as long as one write), so it asks for as little as it can: the lowest CPU
    priority (SCHED_IDLE: it runs when a CPU would otherwise idle) and no CRC32 over the 190 MB
    (two thirds of torch.save's CPU time; the atomic rename, not a checksum, is what keeps a torn
    checkpoint from being read, and loading still verifies the zip structure).
    """
    with contextlib.suppress(AttributeError, OSError):  # not on every platform
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(AttributeError):  # torch < 2.6
        torch.serialization.set_crc32_options(False)
    answers = os.fdopen(os.dup(1), "wb")  # the answers' channel: nothing else may write into it,
    os.dup2(2, 1)  # so anything printed to fd 1 (a library's message) goes to stderr
    _serve(sys.stdin.buffer, answers)
    return 0
