"""`ampbench evaluate`'s main: score the study's variants' models (stages/evaluate.py) on the prepared
test set, all in this one process.

    ampbench evaluate                                      # every variant of params.yaml's `variants:`
    ampbench evaluate --parallel single --precision autocast   # one variant (the MLproject entry point)

One process for the whole study, not one per variant: a stage process spends seconds importing torch,
MLflow, scikit-learn and matplotlib and opening the store before it scores anything (4-6 s on an
H200 host), while scoring one variant's three models takes about 3 s there.
"""

from __future__ import annotations

import argparse
import logging

from ampbench import outputs
from ampbench.config import Config, ConfigError
from ampbench.paths import DATA_FILE, MODELS_DIR, REPORTS_DIR
from ampbench.report import mixed
from ampbench.stages.download import check_prepared
from ampbench.stages.starting import StartingLine
from ampbench.timing import StageClock
from ampbench.variants import PARALLELS, PRECISIONS, VARIANTS, study_variants, variant_name

log = logging.getLogger(__name__)


def add_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("--parallel", choices=PARALLELS, help="with --precision: one variant only")
    ev.add_argument("--precision", choices=PRECISIONS, help="with --parallel: one variant only")
    ev.add_argument(
        "--variants", default="", help="comma-separated variant names (default: params.yaml's `variants:`)"
    )
    ev.add_argument(
        "--allow-mixed",
        action="store_true",
        help="evaluate models trained with different settings (refused otherwise: one study, one setting)",
    )


def chosen_variants(args) -> list[str]:
    """One variant (--parallel/--precision), the --variants list, or params.yaml's study."""
    if bool(args.parallel) != bool(args.precision):  # hostile pass P: --parallel alone meant fp32
        given, missing = ("--parallel", "--precision") if args.parallel else ("--precision", "--parallel")
        raise ConfigError(f"{given} names one variant with {missing}: give both, or neither for the study")
    if args.parallel:
        return [variant_name(args.parallel, args.precision)]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] or study_variants(
        args.params, args.overrides
    )
    if repeated := sorted({v for v in variants if variants.count(v) > 1}):  # as compare: scored twice
        raise ConfigError(f"--variants: {', '.join(repeated)} named twice; name each variant once")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    return variants


def main(cfg: Config, args, argv: list[str]) -> int:
    with StartingLine("evaluate", doing="loading the models and the test set, opening the MLflow store"):
        return _evaluate(cfg, args)


def _evaluate(cfg: Config, args) -> int:
    variants = chosen_variants(args)
    check_prepared(cfg)  # before torch is imported: a refusal is immediate
    from ampbench.data import prepared
    from ampbench.stages import evaluate
    from ampbench.training import memory_check

    memory_check.check_address_space(cfg)  # under `ulimit -v`: one line, not a crash mid-way
    from ampbench.tracking import evaluate_runs
    from ampbench.tracking.tracker import Tracker

    clock = StageClock()  # its start-up part: process start and the imports above
    # One study, one configuration: refused before any run is touched (compare refuses it too).
    trained = evaluate.settings_of(variants, cfg.train.seeds, MODELS_DIR)
    mixed.check(trained, args.allow_mixed)
    tracker = Tracker.from_config(cfg)
    tracker.preflight()
    evaluate.check_models(variants, cfg.train.seeds, MODELS_DIR, _given(args))
    if changed := mixed.since_trained(trained, cfg.digest(), cfg.digested(), getattr(args, "overrides", ())):
        log.warning("%s", changed)
    data_ref = {"digest": prepared.file_digest(DATA_FILE), "source": cfg.data.url}
    dataset = prepared.load_dataset(DATA_FILE)
    clock.mark("setup")
    # reports/metrics and reports/plots all or nothing: a variant refused leaves the old reports
    with outputs.staged(REPORTS_DIR, folders=evaluate.FOLDERS) as staging:
        for i, variant in enumerate(variants):
            # Each variant's run gets its own time breakdown; the first also carries the start-up.
            summary = evaluate.evaluate_variant(
                variant,
                cfg.train.seeds,
                MODELS_DIR,
                dataset,
                staging,
                tracker,
                cfg.tracking.log_model,
                data_ref,
                clock if i == 0 else StageClock(startup=0.0),
            )
            log.info("%s: test accuracy %s", variant, _accuracy_said(summary))
            evaluate_runs.log_to_launcher(tracker, summary)
    return 0


def _accuracy_said(summary: dict) -> str:
    """'0.8452 ± 0.0013 over 3 seeds'; one seed has no spread (hostile pass Z: "± 0.0000 over 1 seeds")."""
    seeds = len(summary["seeds"])
    if seeds == 1:
        return f"{summary['test_accuracy']:.4f} (one seed: no spread)"
    return f"{summary['test_accuracy']:.4f} ± {summary['test_accuracy_std']:.4f} over {seeds} seeds"


def _given(args) -> list[str]:
    """The --params and --set words of this command, which the training of a missing model needs
    too (hostile pass D8: `--set train.seeds=[5]` named a training of params.yaml's seeds)."""
    given = ["--params", args.params] if args.params != "params.yaml" else []
    return given + [word for item in getattr(args, "overrides", ()) or () for word in ("--set", item)]
