"""Start DDP workers through torchrun (torch.distributed's launcher).

A plain `ampbench train --parallel ddp ...` re-runs itself as ``python -m torch.distributed.run
--standalone --nproc-per-node N -m ampbench train ...`` with N = the visible GPUs, or
``train.ddp_cpu_workers`` gloo processes without a GPU. Under an outer ``torchrun --nnodes ...``
(RANK is set) the same command is already a worker and runs directly.

torchrun ends every worker when one fails (``--max-restarts 0``) and ``record`` makes the failing
worker's own traceback reach the launcher's report. If the job dies, runs it left RUNNING in
MLflow are ended FAILED here.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

log = logging.getLogger(__name__)

__all__ = ["record", "torchrun", "worker_count"]


def worker_count(cfg) -> int:
    return torch.cuda.device_count() or cfg.train.ddp_cpu_workers


def torchrun(argv: list[str], cfg, work_dir: Path) -> int:
    """Run the DDP workers; ``work_dir``: the variant's in-progress folder (runs to end if they fail)."""
    n = worker_count(cfg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "--max-restarts=0", "-m", "ampbench", *argv]  # fmt: skip
    log.info("launching %d DDP worker(s): %s", n, " ".join(cmd))
    proc = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, lambda s, f: proc.send_signal(signal.SIGTERM))
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the workers too; let them save and stop
        code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code:
        _fail_dangling_runs(cfg, work_dir)
    return code


def _fail_dangling_runs(cfg, variant_dir: Path) -> None:
    from ampbench import checkpoint
    from ampbench.tracking import Tracker

    run_ids = []
    for ckpt in sorted(variant_dir.glob("seed-*/checkpoint.pt")):
        try:
            run_ids.append(checkpoint.load(ckpt)["run_id"])
        except Exception:  # a checkpoint we cannot read names no run
            continue
    for run_file in sorted([*variant_dir.glob("seed-*/run.json"), variant_dir / "variant.json"]):
        try:
            run_ids.append(json.loads(run_file.read_text())["run_id"])
        except (OSError, ValueError, KeyError):  # missing, or torn by the crash
            continue
    if run_ids:
        Tracker.from_config(cfg).mark_failed_if_running(run_ids)
