"""`ampbench train`'s main: check the data, then train here or start the DDP workers.

    ampbench train --parallel single --precision autocast

``--parallel ddp`` outside torchrun starts torchrun's agent (stages/launch.py), whose workers run
this same command with RANK set; every other variant, and each DDP worker, trains in this process
(stages/train.py).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal

from ampbench.config import Config, ConfigError
from ampbench.paths import DATA_FILE, MODELS_DIR, WORK_DIR
from ampbench.stages.download import check_prepared
from ampbench.variants import variant_name

log = logging.getLogger(__name__)


def main(cfg: Config, args, argv: list[str]) -> int:
    check_prepared(cfg)  # before torch is imported: a refusal is immediate
    from ampbench.stages import launch
    from ampbench.training import parallel

    if not parallel.STRATEGIES[args.parallel].in_process and "RANK" not in os.environ:
        workers = launch.worker_count(cfg)
        if cfg.train.batch_size % workers:
            raise ConfigError(
                f"train.batch_size={cfg.train.batch_size} does not divide by the {workers} DDP workers "
                f"this machine starts; choose a multiple of {workers}"
            )
        work = WORK_DIR / variant_name(args.parallel, args.precision)
        return launch.torchrun(argv, cfg, work, resume_hint(argv))
    # Here, not above: torchrun's agent needs neither MLflow nor the trainer (~2 s of imports).
    from ampbench.stages import train
    from ampbench.training import loop

    stop = train.StopFlag(watch_parent="RANK" in os.environ)  # a DDP worker: stop if torchrun dies
    try:
        results = launch.record(train.train_variant)(
            cfg, args.parallel, args.precision, MODELS_DIR, DATA_FILE, args.fresh, stop, WORK_DIR
        )
    except loop.Stopped as stopped:
        work = WORK_DIR / variant_name(args.parallel, args.precision)
        if int(os.environ.get("RANK", "0")) == 0:
            log.warning("%s in %s/. %s", stopped, work, resume_hint(argv))
        return 128 + (stop.signum or signal.SIGTERM)  # the conventional status: 130 Ctrl-C, 143 SIGTERM
    for r in results:
        log.info(
            "seed %s: test accuracy %.4f, %.0f images/s, train %.1f s, diverged=%s, run %s",
            r["seed"],
            r["final_test_accuracy"],
            r["images_per_second"],
            r["train_seconds"],
            r["diverged"],
            r["run_id"],
        )
    return 0


def resume_hint(argv: list[str]) -> str:
    """The exact command that resumes a stopped stage (a re-run finds the checkpoint): the one that
    started the pipeline when it says so (`make run` sets AMPBENCH_RESUME_COMMAND), else this one."""
    started_by = os.environ.get("AMPBENCH_RESUME_COMMAND")
    if started_by:
        return f"To resume: {started_by}"
    command = shlex.join(["ampbench", *argv])
    return f"To resume, run the same command again: {command} (or the dvc repro / make run that started it)"
