"""Start DDP workers through torchrun (torch.distributed's launcher).

A plain `ampbench train --parallel ddp ...` runs torchrun's agent in its own process, as
``torchrun --standalone --nproc-per-node N -m ampbench train ...`` would, with N = the visible GPUs, or
``train.ddp_cpu_workers`` gloo processes without a GPU. Under an outer ``torchrun --nnodes ...``
(RANK is set) the same command is already a worker and runs directly.

torchrun ends every worker when one fails (``--max-restarts 0``) and ``record`` makes the failing
worker's own traceback reach the launcher's report. If the job dies, runs it left RUNNING in
MLflow are ended FAILED here.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ampbench.paths import MODELS_DIR
from ampbench.stages.stop import LATE, LAUNCHED_ENV

log = logging.getLogger(__name__)

__all__ = ["check_fits", "record", "torchrun", "worker_count"]


def worker_count(cfg) -> int:
    return torch.cuda.device_count() or cfg.train.ddp_cpu_workers


def check_fits(cfg, workers: int) -> None:
    """The checks each worker makes before any run (the schedule's length, training/loader.py; the
    memory, training/memory_check.py), made once before torchrun starts: ``workers`` gloo processes
    share this host's memory. A refusal is then the check's one line, not torchrun's report of every
    worker's. With GPUs each worker checks its own device's memory: asking here would hold a CUDA
    context for the whole run."""
    from ampbench.data import prepared
    from ampbench.paths import DATA_FILE
    from ampbench.training import loader, memory_check

    dataset = prepared.load_dataset(DATA_FILE)  # mmap: only what is used is read
    loader.check_batch(cfg.train.batch_size, dataset, cfg.train.epochs)  # its schedule, too
    if torch.cuda.device_count():
        return
    memory_check.check_fits(cfg, torch.device("cpu"), len(dataset["classes"]), workers)


def torchrun(argv: list[str], cfg, work_dir: Path, resume_hint: str) -> int:
    """Run the DDP workers; ``work_dir``: the variant's in-progress folder (runs to end if they fail),
    ``resume_hint``: what a stop says to resume.

    torchrun's agent runs in this process (``torch.distributed.run.main``, what the ``torchrun``
    command calls): a separate launcher process would import torch once more before the workers
    do (~5 s on the H200 host). The agent turns SIGTERM and Ctrl-C into a stop of every worker
    (each saves a checkpoint and ends its run KILLED), then raises here.
    """
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    n = worker_count(cfg)
    args = ["--standalone", f"--nproc-per-node={n}", "--max-restarts=0", "-m", "ampbench", *argv]
    log.debug("launching %d DDP worker(s): torchrun %s", n, " ".join(args))
    if not log.isEnabledFor(logging.DEBUG):  # --verbose keeps them
        # torchrun's notes: "Setting OMP_NUM_THREADS ..." at each start, "Received 15 death signal"
        # and "Sending process N closing signal SIGTERM" per worker at a stop (each worker's own
        # stop line says it)
        for name in ("multiprocessing.api", "agent.server.api"):
            logging.getLogger(f"torch.distributed.elastic.{name}").setLevel(logging.ERROR)
        logging.getLogger("torch.distributed.run").setLevel(logging.ERROR)
    # The agent installs handlers for these and never puts ours back.
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    }
    if handlers[signal.SIGHUP] is signal.SIG_IGN:  # nohup: the agent must not take SIGHUP as a stop
        # (final pass K: `nohup make run` ended at a hang-up in the DDP stage); its workers inherit
        # the ignored SIGHUP, as their StopFlag keeps it
        # torchrun's --signals-to-handle (read from PET_SIGNALS_TO_HANDLE) sets the agent's list
        os.environ["PET_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGQUIT"
    code, started = 1, time.time()
    os.environ[LAUNCHED_ENV] = "1"  # the workers leave a late stop's line to this process
    try:
        torch_run.main(args)  # @record: a failed worker's traceback is printed as the root cause
        code = 0
    except ChildFailedError as failed:
        log.error("%s", failed)  # torchrun's report: the failing worker's traceback as the Root Cause
    except SignalException as stop:  # the workers were told to stop (and saved) first
        # or they had published every seed: rank 0 said the stop came late (hostile pass J: "nothing
        # was saved", 143, and a resume that trained every seed again)
        code = 0 if _published_since(work_dir.name, cfg.train.seeds, started) else 128 + int(stop.sigval)
        name = signal.Signals(stop.sigval).name
        if code:
            log.warning("stopped by %s: %s", name, _what_was_saved(work_dir, resume_hint))
        else:  # said here, not by rank 0 (pass K: it may have ended before the stop came)
            log.warning("%s %s", name, LATE)
    except Exception:  # the agent itself failed (rendezvous, store, ...): its workers are stopped
        log.exception("torchrun's agent failed")
    finally:
        os.environ.pop(LAUNCHED_ENV, None)
        for sig, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing to restore
                signal.signal(sig, handler)
        if code:
            _fail_dangling_runs(cfg, work_dir)
    return code


def _published_since(variant: str, seeds, since: float) -> bool:
    """Every seed's model of ``variant`` published by this launch (at or after ``since``)."""
    models = [MODELS_DIR / variant / f"seed-{seed}" / "model.pt" for seed in seeds]
    try:
        return all(m.stat().st_mtime >= since - 1.0 for m in models)  # (file times: coarse)
    except OSError:  # one missing: not all published
        return False


def _what_was_saved(work_dir: Path, resume_hint: str) -> str:
    """The stop's words from what is on disk: workers stopped while they still started (before
    their first step) saved nothing, and saying they had would be a false promise."""
    saved = sorted(work_dir.glob("seed-*/checkpoint.pt")) + sorted(work_dir.glob("seed-*/model.pt"))
    if saved:
        return f"the DDP workers saved their work in {work_dir}/. {resume_hint}"
    return f"the DDP workers stopped before their first checkpoint: nothing was saved. {resume_hint}"


def _fail_dangling_runs(cfg, variant_dir: Path) -> None:
    from ampbench.checkpoints.state import SeedCheckpoint
    from ampbench.tracking.tracker import Tracker

    run_ids = []
    for ckpt in sorted(variant_dir.glob("seed-*/checkpoint.pt")):
        try:
            run_ids.append(SeedCheckpoint.load(ckpt).run_id)
        except Exception:  # a checkpoint we cannot read names no run
            continue
    for run_file in sorted([*variant_dir.glob("seed-*/run.json"), variant_dir / "variant.json"]):
        try:
            run_ids.append(json.loads(run_file.read_text(encoding="utf-8"))["run_id"])
        except (OSError, ValueError, KeyError):  # missing, or torn by the crash
            continue
    run_ids = [r for r in run_ids if r]
    if run_ids:
        Tracker.from_config(cfg).mark_failed_if_running(run_ids)
