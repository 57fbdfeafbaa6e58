"""`ampbench bench`: training throughput of chosen variants, untracked by the study, and its report.

    ampbench bench --variants single-fp32,single-autocast,single-autocast_gradscaler --batch-size 512

Measures each variant's pipeline (the real training loop), its ceiling (the bare step on one
resident batch) and the tutorial's DataLoader feeding the same step (stages/bench_measure.py says
how), each as the median of ``--windows`` timed windows. Writes ``<out>.md`` and ``<out>.json``
first, then records them in MLflow (experiment ``<tracking.experiment>-bench``); with
``--profile N`` the report also lists the time per kernel (CPU: per operator) of the ceiling step.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ampbench.config import Config, replace
from ampbench.paths import DATA_FILE
from ampbench.variants import split_name

log = logging.getLogger(__name__)

PROFILE_ROWS = 25  # kernels listed per profiled variant in the markdown (the JSON has all)


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.data import prepared
    from ampbench.stages import bench_measure

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    _check_benchmarkable(variants)
    if args.batch_size:
        cfg = replace(cfg, train={"batch_size": args.batch_size})
    dataset = prepared.load_dataset(DATA_FILE)
    if args.max_images:
        n = args.max_images
        dataset.update(train_images=dataset["train_images"][:n], train_labels=dataset["train_labels"][:n])
    res = {}
    for mode in _compile_modes(args.compile, cfg):  # each mode measured whole, one after another
        one = bench_measure.run(
            replace(cfg, train={"compile": mode}),
            variants,
            dataset,
            args.steps,
            args.warmup,
            args.workers,
            args.profile,
            args.windows,
        )
        rows = [{**r, "compile": mode} for r in one["rows"]]
        res = {**one, "rows": res.get("rows", []) + rows, "compile": res.get("compile", []) + [mode]}
    res["train_images"] = len(dataset["train_labels"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res["run_id"] = None
    _write(res, out)  # first: the results never depend on the tracking store
    res["run_id"] = track(cfg, res, out)
    print(to_markdown(res))
    return 0 if res["run_id"] else 1  # measured, but not recorded: a failure, said in one line above


def _compile_modes(text: str, cfg: Config) -> list[str]:
    from ampbench.config import COMPILE_MODES

    modes = [m.strip() for m in text.split(",") if m.strip()] or [cfg.train.compile]
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise ValueError(f"--compile: {', '.join(bad)} not one of {', '.join(COMPILE_MODES)}")
    return modes


def _check_benchmarkable(variants: list[str]) -> None:
    """Only variants that train in this process can be benchmarked (not ddp: one process per rank)."""
    from ampbench.training import parallel, precision

    in_process = [name for name, s in parallel.STRATEGIES.items() if s.in_process]
    bad = [
        v
        for v in variants
        if split_name(v)[0] not in in_process or split_name(v)[1] not in precision.REGISTRY
    ]
    if bad:
        raise ValueError(
            f"--variants: {', '.join(bad)} not benchmarkable (in-process variants only: "
            f"{', '.join(p + '-*' for p in in_process)})"
        )


def to_markdown(res: dict) -> str:
    lines = [
        f"Hardware: {res['hardware']}; torch {res['torch']}; TF32 off; cudnn.benchmark "
        f"{'on' if res['cudnn_benchmark'] else 'off'}; batch {res['batch']}; "
        f"{res['gflop_per_image']:.3f} GFLOP per training image (counted). Median and min–max over "
        f"{res['windows']} windows per measure: pipeline one full epoch ({res['pipeline_steps']} "
        f"steps) and ceiling {res['steps']} steps, alternating; dataloader {res['dataloader_steps']} "
        f"steps; each trainer warmed up first ({res['warmup']}+ steps, graph capture and compile included: "
        "warm-up s).",
        "",
        "| measure | variant | compile | amp dtype | images/s (median) | min–max | ms/step | of ceiling "
        "| TFLOP/s | peak MB | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['measure']} | {r['variant']} | {r.get('compile', 'none')} | {r['amp_dtype']} "
            f"| {r['images_per_second']:,.0f} "
            f"| {r['images_per_second_min']:,.0f}–{r['images_per_second_max']:,.0f} "
            f"| {r['ms_per_step']:.2f} | {r['fraction_of_ceiling']:.0%} | {r['tflops']:.1f} "
            f"| {r['peak_memory_mb']:,.0f} | {r['warmup_seconds']:.2f} |"
        )
    noisy = [f"{r['measure']} {r['variant']} ({r['noisy']})" for r in res["rows"] if r.get("noisy")]
    lines += [
        "",
        "Self-check: "
        + (
            "; ".join(noisy) + ": re-run on a quiet machine."
            if noisy
            else "every measure's windows within 5% of their mean (CV)."
        ),
    ]
    for variant, p in res.get("profiles", {}).items():
        lines += [
            "",
            f"Profile of the ceiling step, {variant} ({p['steps']} steps, torch.profiler): kernels "
            f"(CPU: operators' self time) busy {p['busy_ms_per_step']:.3f} ms of {p['ms_per_step']:.3f} ms "
            "per step.",
            "",
            "| kernel / operator | µs/step | calls/step |",
            "|---|---|---|",
        ]
        lines += [
            f"| `{k['kernel'][:100]}` | {k['us_per_step']:.1f} | {k['calls_per_step']:g} |"
            for k in p["kernels"][:PROFILE_ROWS]
        ]
    return "\n".join(lines) + "\n"


def _write(res: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(to_markdown(res))


def track(cfg, res: dict, out: Path) -> str | None:
    """An MLflow run for this bench in experiment ``<tracking.experiment>-bench`` (apart from the
    study's, whose runs table stays one row per variant): settings as params, every median as a
    metric, the JSON and Markdown (rewritten to name the run) as artifacts. Returns the run id, or
    None with a warning if any of it failed (the run, if started, is ended FAILED): the files
    hold the results either way."""
    from ampbench.tracking.tracker import KIND_TAG, Tracker

    t, tracker, run_id = cfg.tracking, None, None
    try:
        tracker = Tracker(f"{t.experiment}-bench", t.preflight_timeout_s, t.request_timeout_s)
        tracker.preflight()
        params = {
            k: res[k]
            for k in (
                "hardware",
                "torch",
                "tf32",
                "batch",
                "steps",
                "warmup",
                "windows",
                "cudnn_benchmark",
                "train_images",
            )
        }
        run_id = tracker.start("bench", {KIND_TAG: "bench"}, params)
        metrics = {}
        for r in res["rows"]:
            mode = r.get("compile", "none")
            key = f"bench/{r['measure'].split(' ')[0]}/{r['variant']}" + (
                "" if mode == "none" else f"/compile-{mode}"
            )
            metrics.update(
                {
                    f"{key}/images_per_second": r["images_per_second"],
                    f"{key}/fraction_of_ceiling": r["fraction_of_ceiling"],
                    f"{key}/ms_per_step": r["ms_per_step"],
                }
            )
        tracker.log_metrics(run_id, metrics)
        _write({**res, "run_id": run_id}, out)
        for suffix in (".json", ".md"):
            tracker.log_artifact(run_id, out.with_suffix(suffix))
        tracker.end(run_id, "FINISHED")
        return run_id
    except Exception as err:  # the store failed: the measurement must not be lost with it
        from ampbench.tracking import store

        log.error(
            "bench not recorded in MLflow: %s. The results are in %s.json and .md",
            store.store_fault(err) or err,
            out,
        )
        if run_id:
            tracker.end_quietly(run_id, "FAILED")
            _write(res, out)  # without the id of a run that does not hold them
        return None
