"""A DDP job that lost one of its processes: the error a collective raises, told as one line.

When a node (or one worker) of a multi-node job dies, every other worker's next collective fails:
gloo raises a RuntimeError naming its TCP pair ("Connection reset by peer", "Connection closed"),
NCCL and the c10d store raise ``torch.distributed.DistError`` subclasses. None of them is a bug of
the surviving process, and its checkpoint (``train.checkpoint_every_s``) is what a re-run resumes
from, so the survivor says that in one line instead of a traceback.
"""

from __future__ import annotations

import os

from ampbench.chains import chain

# Words of a collective that failed because its peer is gone (gloo, NCCL, the c10d store).
PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "connection closed",
    "broken pipe",
    "socket closed",
    "nccl communicator was aborted",
    "remote process exited",
)


def lost_peer(err: BaseException) -> str | None:
    """The cause in a few words when ``err`` (or an exception it chains) is a collective that lost
    its peer in a job of several processes; None for anything else (a real error of this process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    import torch.distributed as dist

    for current in chain(err):
        text = str(current).lower()
        if isinstance(current, dist.DistError) or (
            isinstance(current, RuntimeError) and any(words in text for words in PEER_GONE)
        ):
            return _short(str(current))
    return None


def stop_line(err: BaseException, variant: str, work) -> str | None:
    """What a worker that lost its peer says (None: err is not that): one line, and how to resume."""
    cause = lost_peer(err)
    if cause is None:
        return None
    return (
        f"{variant}: another process of this DDP job is gone ({cause}), so this one stops. Its work "
        f"is kept in {work}/ (saved every train.checkpoint_every_s); when every node is back, run the "
        "same command on each to resume."
    )


def _short(message: str) -> str:
    """gloo's message starts with its source path and ends with advice for its developers."""
    first = message.strip().splitlines()[0] if message.strip() else "a collective failed"
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return first.split(". This is typically")[0].rstrip(".")[:160]
