"""`ampbench train`'s main: check the data, then train here or start the DDP workers.

    ampbench train --parallel single --precision autocast

``--parallel ddp`` outside torchrun starts torchrun's agent (stages/launch.py), whose workers run
this same command with RANK set; every other variant, and each DDP worker, trains in this process
(stages/train.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

from ampbench.cli import all_overrides
from ampbench.cli_options import add_variant_choice
from ampbench.config import Config, ConfigError
from ampbench.paths import DATA_FILE, MODELS_DIR, dvc_recorded, work_root
from ampbench.stages import train_lock
from ampbench.stages.download import check_prepared
from ampbench.stages.starting import StartingLine
from ampbench.stages.stop import watch_launcher
from ampbench.variants import variant_name

log = logging.getLogger(__name__)


DESCRIPTION = (  # `ampbench train --help`
    "Train one variant (--parallel x --precision) once per seed in params.yaml's train.seeds: the "
    "models in models/<variant>/seed-<s>/, checkpoints in checkpoints/<variant>/ (a stopped run "
    "resumes from them), one MLflow run per seed under the variant's run. The pipeline's train "
    "stage: `dvc repro train@single-fp32` runs it when its inputs changed."
)


def add_arguments(t: argparse.ArgumentParser) -> None:
    add_variant_choice(t)
    t.add_argument(
        "--fresh",
        action="store_true",
        help="train every seed from the start: discard this variant's checkpoints and finished seeds "
        "in checkpoints/<variant>/ (e.g. after its model's code changed)",
    )


def main(cfg: Config, args, argv: list[str]) -> int:
    check_prepared(cfg)  # before torch is imported: a refusal is immediate
    from ampbench.checkpoints import work as work_folder
    from ampbench.stages import launch
    from ampbench.training import parallel

    variant = variant_name(args.parallel, args.precision)
    work = work_root(cfg.digest()) / variant
    work_folder.check_writable(work, MODELS_DIR / variant)  # before the lock makes its folder
    if not parallel.STRATEGIES[args.parallel].in_process and "RANK" not in os.environ:
        workers = launch.worker_count(cfg)
        if cfg.train.batch_size % workers:
            raise ConfigError(
                f"train.batch_size={cfg.train.batch_size} does not divide by the {workers} DDP workers "
                f"this machine starts; choose a multiple of {workers}"
            )
        launch.check_fits(cfg, workers)  # once here, not as torchrun's report of every worker's refusal
        with train_lock.hold(work, variant):  # one trainer per variant; its workers join it
            # DVC gone: SIGTERM, which torchrun's agent turns into a stop of every worker
            watch_launcher(lambda: os.kill(os.getpid(), signal.SIGTERM))
            os.environ[train_lock.LAUNCHER_ENV] = str(os.getpid())
            try:
                return launch.torchrun(argv, cfg, work, work_folder.resume_hint(argv))
            finally:
                del os.environ[train_lock.LAUNCHER_ENV]
    with (
        train_lock.for_this_process(work, variant),
        StartingLine(variant, on=os.environ.get("RANK", "0") == "0"),
    ):
        return _train_here(cfg, args, argv, work)


def _train_here(cfg: Config, args, argv: list[str], work) -> int:
    # Here, not in main: torchrun's agent needs neither MLflow nor the trainer (~2 s of imports).
    from ampbench.checkpoints import work as work_folder
    from ampbench.stages import launch, train
    from ampbench.stages.params_watch import ParamsWatch
    from ampbench.stages.stop import StopFlag
    from ampbench.training import loop, peers

    watch = ParamsWatch(cfg, args.params, all_overrides(args))

    def run() -> int:
        try:
            with work_folder.stage_command(argv):  # what its fixes that start afresh repeat
                results = train.train_variant(
                    cfg,
                    args.parallel,
                    args.precision,
                    MODELS_DIR,
                    DATA_FILE,
                    args.fresh,
                    stop,
                    work.parent,
                    watch.check,
                    argv,
                    all_overrides(args),
                )
        except Exception as err:
            line = peers.stop_line(err, variant_name(args.parallel, args.precision), work)
            if line is None:
                raise
            log.error("%s", line)
            return 1
        _said(results)
        plain = args.params == "params.yaml" and not all_overrides(args)
        _say_the_pipeline_replaces(variant_name(args.parallel, args.precision), plain)
        stop.close(completed=True)
        return 0

    # A DDP worker stops if torchrun dies; any other stage if the DVC that started it dies. Last
    # before the try: from here a stop raises Stopped (in record's own set-up too: a warm stage
    # Ctrl-C'd at its first instant ended 143 with cli's line), taken here for its line and status.
    # torchrun's @record writes what escapes into the report it prints: a bug's traceback, never
    # a stop (a BaseException it lets by) or a lost peer (run's own line); the exit status tells torchrun.
    stop = StopFlag(watch_parent="RANK" in os.environ)
    try:
        return launch.record(run)()
    except loop.Stopped as stopped:
        if int(os.environ.get("RANK", "0")) == 0:
            log.warning("%s. %s", _where(stopped, work), work_folder.resume_hint(argv))
        return 128 + (stop.signum or signal.SIGTERM)  # 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
    finally:
        stop.close()


def _where(stopped: BaseException, work) -> str:
    """The stop's line: what it saved, in which folder. Before the first step nothing was trained
    now, but an earlier stop's checkpoint there is kept (hostile pass WARN: "nothing to save in
    checkpoints/X/" beside the checkpoint the re-run then resumed from)."""
    said = str(stopped)
    if said.startswith("stopped before the first training step") and any(work.glob("seed-*/checkpoint.pt")):
        kept = f"the checkpoint in {work}/ is kept"
        return f"stopped before its first training step (nothing trained since its last checkpoint); {kept}"
    return f"{said} in {work}/"


def _say_the_pipeline_replaces(variant: str, plain: bool) -> None:
    """Trained outside the pipeline over models dvc.lock records (hostile pass A7: the next `dvc
    repro` put DVC's cached models back, and this run's model reference then pointed at them; pass
    C8: with params.yaml changed since, it deleted them and trained again). ``plain``: trained with
    params.yaml's settings alone, which `dvc commit` may record as the stage's."""
    published = (MODELS_DIR / variant).as_posix()
    outside = not os.environ.get("DVC_STAGE") and os.environ.get("AMPBENCH_SCOPE") != "variant"
    if outside and os.environ.get("RANK", "0") == "0" and published in dvc_recorded(f"train@{variant}"):
        keep = f"`dvc commit -f train@{variant}` makes these the pipeline's instead"
        log.warning(
            "%s/ is also the pipeline's output: the next `dvc repro` (or `make run`) replaces these models, "
            "with those dvc.lock records or, where params.yaml or the code changed since, by training "
            "again; %s",
            published,
            keep
            if plain
            else "trained with settings given here, not params.yaml's: copy them elsewhere to keep them",
        )


def _said(results) -> None:
    """Each seed's result, in one line."""
    for seed, run_id, r in results:
        log.info(
            "seed %s: test accuracy %.4f, %.0f images/s, train %.1f s, diverged=%s, run %s",
            seed,
            r.final_test_accuracy,
            r.images_per_second,
            r.train_seconds,
            r.diverged,
            run_id,
        )
