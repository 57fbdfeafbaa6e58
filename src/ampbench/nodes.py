"""`python -m ampbench.nodes <torchrun's options> -m ampbench train ...`: torchrun for DDP over
several machines (one per node, as SLURM's srun starts it: docs/PIPELINE.md), ending in one line.

The same agent as the ``torchrun`` command (``torch.distributed.run.main``); only its ending
differs. When a worker fails (a lost node: the survivor's worker says so in one line and exits 1),
torchrun re-raises the failure out of its main, so that Python prints a traceback of the agent and
a report box after the worker's line. Here the failure ends the agent with one line and the worker's
exit status; a stop (SIGTERM, Ctrl-C: each worker saved) ends it with 128 + the signal. The
node that hosts the rendezvous store (the first at ``--rdzv-endpoint``) may be the one lost: the
survivor's agent then fails talking to the store, sometimes before it sees its worker's exit, and
ends with one line too (torchrun's ``finally`` has stopped its workers: each saved).

torch's C++ warnings (a closed store socket: 40 lines of stack frames) are kept to errors unless
``TORCH_CPP_LOG_LEVEL`` says otherwise.
"""

from __future__ import annotations

import logging
import os
import sys

RESUME = "the work is kept in checkpoints/: run the same command on every node to resume"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # read when torch loads, below
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    argv = sys.argv[1:] if argv is None else argv
    # its "failed (exitcode: 1) local_rank: 0 ..." line: the ending below says it, once
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        torch_run.main(argv)
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()
        print(
            f"ampbench.nodes: this node's worker of rank {rank} ended with exit status {first.exitcode} "
            f"(its own line above says why); {RESUME}",
            file=sys.stderr,
            flush=True,
        )
        return first.exitcode if 0 < first.exitcode < 256 else 1
    except RendezvousError as lost:
        print(
            f"ampbench.nodes: the job's rendezvous failed ({type(lost).__name__}: "
            f"{' '.join(str(lost).split())[:160]}): the node hosting --rdzv-endpoint is gone or "
            f"unreachable, or not every node joined; any workers of this node were stopped; {RESUME} "
            "once every node is back",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except SignalException as stop:  # torchrun told its workers to stop; each saved and said so
        return 128 + int(stop.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
