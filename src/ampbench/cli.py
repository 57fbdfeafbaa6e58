"""Command line: `ampbench <stage>` (also `python -m ampbench`). One thin main per stage.

    ampbench download                       # fetch and prepare CIFAR-10 (data.url in params.yaml)
    ampbench train --parallel ddp --precision autocast
    ampbench evaluate --parallel ddp --precision autocast
    ampbench compare
    ampbench variant --precision autocast   # download if needed, train, evaluate (MLproject)
    ampbench bench --variants single-fp32,single-autocast
    ampbench estimate                       # how long the whole study takes on this CPU
    ampbench findings                       # docs/FINDINGS.md: the tutorial's claims, tested

Every stage reads params.yaml (``--params``) and accepts ``--set section.key=value`` overrides;
the whole configuration is validated before anything runs.

Why ~300 lines: the parser (one entry per stage) and the stages' mains belong together, so that one
file shows every command, its options and what it calls; each main is a few lines around a call
into the module that does the work.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from ampbench.config import PARALLELS, PRECISIONS, ConfigError, load_config

log = logging.getLogger("ampbench")

# Paths, written once here (dvc.yaml names the same ones).
DATA_FILE = Path("data/prepared/cifar10.pt")
SOURCE_FILE = DATA_FILE.with_name("source.json")  # the data settings DATA_FILE was made from
RAW_DIR = Path("data/raw")
MODELS_DIR = Path("models")
WORK_DIR = Path("checkpoints")  # in-progress seeds: checkpoints, finished models (no DVC output)
REPORTS_DIR = Path("reports")
VARIANTS = [f"{p}-{q}" for p in PARALLELS for q in PRECISIONS]
EXIT_ERROR, EXIT_USAGE = 1, 2


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--params", default="params.yaml", help="parameter file (default: %(default)s)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter, e.g. --set train.epochs=1 (repeatable)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    variant = argparse.ArgumentParser(add_help=False)
    variant.add_argument("--parallel", choices=PARALLELS, default="single", help="default: %(default)s")
    variant.add_argument("--precision", choices=PRECISIONS, default="fp32", help="default: %(default)s")

    p = argparse.ArgumentParser(
        prog="ampbench",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="<stage>")
    sub.add_parser("download", parents=[common], help="fetch and prepare the dataset")
    t = sub.add_parser("train", parents=[common, variant], help="train one variant, every seed")
    t.add_argument(
        "--fresh",
        action="store_true",
        help="discard a checkpoint written by another configuration and start over",
    )
    sub.add_parser("evaluate", parents=[common, variant], help="evaluate one variant's models")
    c = sub.add_parser("compare", parents=[common], help="compare variants side by side")
    c.add_argument(
        "--variants", default="", help="comma-separated variant names (default: params.yaml's `variants:`)"
    )
    v = sub.add_parser("variant", parents=[common, variant], help="download if needed, train, evaluate")
    v.add_argument("--epochs", default="", help="override train.epochs (empty: params.yaml)")
    v.add_argument("--batch-size", default="", help="override train.batch_size (empty: params.yaml)")
    v.add_argument("--seeds", default="", help="override train.seeds, e.g. 0,1 (empty: params.yaml)")
    v.add_argument("--data-url", default="", help="override data.url (empty: params.yaml)")
    e = sub.add_parser(
        "estimate", parents=[common], help="time a few steps of the real model, estimate the whole study"
    )
    e.add_argument("--force", action="store_true", help="estimate on the CPU even when CUDA is present")
    b = sub.add_parser("bench", parents=[common], help="measure training throughput, untracked")
    b.add_argument("--variants", default="single-fp32,single-autocast,single-autocast_gradscaler")
    b.add_argument("--batch-size", type=int, default=0, help="default: train.batch_size")
    b.add_argument(
        "--steps",
        type=_at_least_one,
        default=50,
        help="timed steps per ceiling and dataloader window (pipeline: one epoch)",
    )
    b.add_argument(
        "--windows",
        type=_at_least_one,
        default=5,
        help="timed windows per measure, reported as median and min-max",
    )
    b.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps")
    b.add_argument("--workers", type=int, default=8, help="DataLoader workers for the reference")
    b.add_argument("--max-images", type=int, default=0, help="use the first N train images; 0: all")
    b.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also profile STEPS ceiling steps per variant with torch.profiler and list "
        "the time per GPU kernel (CPU: per operator); 0: off",
    )
    b.add_argument("--out", default="reports/bench", help="output prefix for .md and .json")
    f = sub.add_parser(
        "findings", parents=[common], help="docs/FINDINGS.md: the tutorial's claims against measured runs"
    )
    f.add_argument("--study", default="reports", help="the project's reports folder (default: %(default)s)")
    f.add_argument(
        "--tutorial",
        default="tutorial/reports",
        help="the tutorial-conditions reports folder (make tutorial; default: %(default)s)",
    )
    f.add_argument("--bench", default="", help="ampbench bench's JSON, e.g. reports/bench.json (optional)")
    f.add_argument("--out", default="docs/FINDINGS.md", help="default: %(default)s")
    f.add_argument(
        "--readme",
        default="README.md",
        help="README whose findings block is refreshed "
        "(between <!-- findings:start/end --> markers, if any); empty: none",
    )
    return p


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# Helper processes of a train stage, started as `ampbench <name> args...`: module:function(*args).
# Not stages: no parser entry, no --help.
HELPERS = {
    "checkpoint-writer": "ampbench.checkpoints.writer:serve_stdio",
    "system-metrics": "ampbench.tracking.train_runs:system_metrics_main",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HELPERS:
        import importlib

        module, function = HELPERS[argv[0]].split(":")
        return getattr(importlib.import_module(module), function)(*argv[1:])
    args = _parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s"
        if "RANK" in os.environ
        else "%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        overrides = list(args.overrides) + _variant_overrides(args)
        cfg = load_config(args.params, overrides)
        return COMMANDS[args.command](cfg, args, argv)
    except ConfigError as err:
        log.error("%s", err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    except Exception as err:
        from ampbench.checkpoints import files
        from ampbench.data import prepared
        from ampbench.stages import train
        from ampbench.tracking.tracker import TrackingError
        from ampbench.training import loop

        known = (
            prepared.DataError,
            TrackingError,
            train.ResumeError,
            files.CheckpointError,
            FileNotFoundError,
            ValueError,
        )
        if isinstance(err, loop.Stopped):
            log.error("%s", err)
            return 143
        if isinstance(err, known) and not args.verbose:
            log.error("%s", err)
            return EXIT_ERROR
        raise


def _variant_overrides(args) -> list[str]:
    out = []
    for flag, key in (
        ("epochs", "train.epochs"),
        ("batch_size", "train.batch_size"),
        ("seeds", "train.seeds"),
        ("data_url", "data.url"),
    ):
        value = str(getattr(args, flag, "") or "").strip()
        if value:
            out.append(f"{key}=[{value}]" if flag == "seeds" else f"{key}={value}")
    return out


def cmd_download(cfg, args, argv) -> int:
    from ampbench.data import prepared

    d = cfg.data
    summary = prepared.prepare(
        d.url,
        DATA_FILE,
        RAW_DIR,
        sha256=d.sha256,
        retries=d.retries,
        timeout_s=d.timeout_s,
        train_per_class=d.train_per_class,
        test_per_class=d.test_per_class,
    )
    made = {**_data_source(cfg), "num_classes": len(summary["classes"])}  # a fact, not a setting
    SOURCE_FILE.write_text(json.dumps(made, indent=1) + "\n")
    return 0


def _data_source(cfg) -> dict:
    """The data settings that decide what the prepared file holds (logged as params too)."""
    d = cfg.data
    return {
        "data.url": d.url,
        "data.sha256": d.sha256,
        "data.train_per_class": d.train_per_class,
        "data.test_per_class": d.test_per_class,
    }


def _prepared_mismatch(cfg) -> list[str]:
    """Settings whose value differs from what data/prepared was made from (empty: consistent)."""
    if not SOURCE_FILE.exists():
        return []  # prepared by hand or by an older version: nothing to compare
    made = json.loads(SOURCE_FILE.read_text())
    return [
        f"{k}: prepared from {made.get(k)!r}, configured {v!r}"
        for k, v in _data_source(cfg).items()
        if made.get(k) != v
    ]


def _check_prepared(cfg) -> None:
    """Refuse to train or evaluate on data other than the params say (the run would log wrong params)."""
    wrong = _prepared_mismatch(cfg)
    if wrong:
        raise ConfigError(
            f"{DATA_FILE} does not match the data settings:\n  "
            + "\n  ".join(wrong)
            + "\nRun `ampbench download` (or `dvc repro`) with these settings first."
        )


def cmd_train(cfg, args, argv) -> int:
    from ampbench.stages import launch, train

    _check_prepared(cfg)
    from ampbench.training import parallel

    if not parallel.STRATEGIES[args.parallel].in_process and "RANK" not in os.environ:
        workers = launch.worker_count(cfg)
        if cfg.train.batch_size % workers:
            raise ConfigError(
                f"train.batch_size={cfg.train.batch_size} does not divide by the {workers} DDP workers "
                f"this machine starts; choose a multiple of {workers}"
            )
        return launch.torchrun(argv, cfg, WORK_DIR / f"{args.parallel}-{args.precision}")
    stop = train.StopFlag(watch_parent="RANK" in os.environ)  # a DDP worker: stop if torchrun dies
    results = launch.record(train.train_variant)(
        cfg, args.parallel, args.precision, MODELS_DIR, DATA_FILE, args.fresh, stop, WORK_DIR
    )
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


def cmd_evaluate(cfg, args, argv) -> int:
    from ampbench.data import prepared
    from ampbench.stages import evaluate
    from ampbench.timing import StageClock
    from ampbench.tracking.tracker import Tracker

    clock = StageClock()
    _check_prepared(cfg)
    tracker = Tracker.from_config(cfg)
    tracker.preflight()
    variant = f"{args.parallel}-{args.precision}"
    data_ref = {"digest": prepared.file_digest(DATA_FILE), "source": cfg.data.url}
    dataset = prepared.load_dataset(DATA_FILE)
    clock.mark("setup")
    summary = evaluate.evaluate_variant(
        variant,
        cfg.train.seeds,
        MODELS_DIR,
        dataset,
        REPORTS_DIR,
        tracker,
        cfg.tracking.log_model,
        data_ref,
        clock,
    )
    log.info(
        "%s: test accuracy %.4f ± %.4f over %d seeds",
        variant,
        summary["test_accuracy"],
        summary["test_accuracy_std"],
        len(summary["seeds"]),
    )
    launcher = tracker.launcher_run_id  # under `mlflow run`: the entry point's run gets the summary too
    if launcher and launcher not in {s.get("variant_run_id") for s in summary["seeds"]}:
        keys = ("test_accuracy", "test_accuracy_std", "images_per_second", "train_seconds")
        tracker.log_metrics(launcher, {k: summary[k] for k in keys})
    return 0


def cmd_compare(cfg, args, argv) -> int:
    from ampbench.report import compare
    from ampbench.tracking.tracker import KIND_TAG, Tracker
    from ampbench.training import estimate

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    variants = variants or estimate.study_variants(args.params)  # dvc.yaml's matrix
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    tracker = Tracker.from_config(cfg)
    tracker.preflight()
    rows = compare.compare(REPORTS_DIR / "metrics", variants, REPORTS_DIR, compare.subset_notice(cfg))
    print((REPORTS_DIR / "comparison.md").read_text())
    # The comparison's numbers go to each variant's run (its row in the UI); the compare run holds
    # the table and chart only, so it adds no charts beside the training runs'.
    for r in rows:
        for run_id in r["variant_run_ids"]:
            tracker.log_metrics(
                run_id,
                {
                    k: r[k]
                    for k in ("speedup", "accuracy_delta", "p_value")
                    if isinstance(r[k], float) and r[k] == r[k]
                },
            )
    run_id = tracker.start("compare", {KIND_TAG: "compare"}, {"variants": ",".join(variants)})
    for name in ("comparison.md", "comparison.csv", "comparison.png", "summary.json"):
        tracker.log_artifact(run_id, REPORTS_DIR / name)
    tracker.end(run_id, "FINISHED")
    print(f"Browse the runs: {tracker.link()}")
    return 0


def cmd_variant(cfg, args, argv) -> int:
    """The MLproject entry point: everything one variant needs, in one command."""
    base = ["--params", args.params, *sum((["--set", o] for o in _all_overrides(args)), [])]
    if not DATA_FILE.exists() or _prepared_mismatch(cfg):
        code = main(["download", *base])
        if code:
            return code
    v = ["--parallel", args.parallel, "--precision", args.precision]
    code = main(["train", *v, *base]) or main(["evaluate", *v, *base])
    if not code:
        from ampbench.tracking.tracker import Tracker

        print(f"Browse the runs: {Tracker.from_config(cfg).link()}")
    return code


def _all_overrides(args) -> list[str]:
    return list(args.overrides) + _variant_overrides(args)


def cmd_bench(cfg, args, argv) -> int:
    from ampbench.stages import bench

    bench.main(cfg, args, DATA_FILE)
    return 0


def cmd_estimate(cfg, args, argv) -> int:
    from ampbench.training import progress

    progress.preflight(cfg, args.params, force=args.force)
    return 0


def cmd_findings(cfg, args, argv) -> int:
    from ampbench.report import findings

    findings.main(
        Path(args.study),
        Path(args.tutorial),
        Path(args.bench) if args.bench else None,
        Path(args.out),
        Path(args.readme) if args.readme else None,
    )
    print(f"wrote {args.out}")
    return 0


COMMANDS = {
    "findings": cmd_findings,
    "download": cmd_download,
    "train": cmd_train,
    "evaluate": cmd_evaluate,
    "compare": cmd_compare,
    "variant": cmd_variant,
    "bench": cmd_bench,
    "estimate": cmd_estimate,
}
