"""`ampbench explain`: why AMP pays or not on this machine, rung by rung (stages/explain_measure.py).

    ampbench explain                 # reports/explain.{json,md,png}; MLflow <experiment>-explain

On a GPU: every rung from the tutorial's conditions (R0) to the defaults (R4) and compile (R5),
each precision, then the batch crossover. On a CPU: R0–R2 at an eighth of the batch, in a minute,
and the report says plainly that CPU figures say nothing about any GPU.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path

from ampbench.config import Config
from ampbench.paths import DATA_FILE

log = logging.getLogger(__name__)
CPU_NOTE = (
    "Measured on a CPU: these figures say nothing about any GPU (no tensor cores, no cuDNN, no CUDA "
    "graphs); run `ampbench explain` on the GPU you care about."
)


def _options(args, cuda: bool) -> dict:
    pick = {"steps": (40, 3), "windows": (5, 2), "profile_steps": (10, 2)}
    opts = {k: getattr(args, k) or (gpu if cuda else cpu) for k, (gpu, cpu) in pick.items()}
    opts["warmup_epochs"] = 1
    opts["max_images"] = args.max_images if args.max_images >= 0 else (0 if cuda else 320)
    return opts


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.data import prepared
    from ampbench.stages import explain_measure as em

    dataset = prepared.load_dataset(DATA_FILE)
    strategy = em.setup_device()
    device, cuda = strategy.device, strategy.device.type == "cuda"
    opts = _options(args, cuda)
    if opts["max_images"]:
        n = opts["max_images"]
        dataset.update(train_images=dataset["train_images"][:n], train_labels=dataset["train_labels"][:n])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = em.rung_configs(cfg, device)
    if args.rungs:  # a part of another explain (below): these rungs only, into its JSON
        todo = [r for r in todo if r[0] in args.rungs.split(",")]
    apart = []
    if cuda and not args.rungs:
        # cuDNN keeps the plan it chose for a shape without autotuning and reuses it once
        # autotuning is on (measured: R3 at R2's fp32 speed), so the rungs without autotuning run
        # in a process of their own.
        off = [name for name, _, c in todo if not c.train.cudnn_benchmark]
        apart = _measured_apart(args, opts, off, out)
        todo = [r for r in todo if r[0] not in off]
    from ampbench.training.energy import Energy

    energy = Energy(device)
    rungs = apart + [_rung(em, name, what, c, dataset, strategy, energy, opts) for name, what, c in todo]
    if args.rungs:
        out.with_suffix(".json").write_text(json.dumps({"rungs": rungs}) + "\n")
        return 0
    res = {
        "hardware": strategy.facts()["device_name"],
        "device_type": device.type,
        "note": "" if cuda else CPU_NOTE,
        "tf32": False,
        "options": opts,
        "energy_counter": energy.available,
        "defaults_rung": em.DEFAULTS_RUNG,
        "rungs": rungs,
    }
    if not args.no_crossover:
        batches = [32, 64, 128, 256, 512, 1024, 2048, 4096] if cuda else [8, 16, 32]
        res["crossover"] = em.crossover(cfg, dataset, strategy, batches, opts)
    res["run_id"] = None
    write(res, out)
    res["run_id"] = track(cfg, res, out)
    print(to_markdown(res))
    return 0 if res["run_id"] else 1


def _rung(em, name: str, what: str, cfg, dataset, strategy, energy, opts: dict) -> dict:
    """One rung, every precision; speed-ups as ratios of this rung's medians."""
    from ampbench.stages import bench_measure

    flops = bench_measure.train_flops_per_image(cfg, len(dataset["classes"]))
    cells = [
        em.measure_cell(cfg, p, dataset, strategy, energy, flops, opts)
        for p in em.precisions(strategy.device)
    ]
    tf32 = next((c for c in cells if c["precision"] == "tf32"), None)
    for c in cells:
        c["speedup_vs_fp32"] = c["images_per_second"] / cells[0]["images_per_second"]
        if tf32:  # AMP's gain against what PyTorch runs by default on Ampere and newer
            c["speedup_vs_tf32"] = c["images_per_second"] / tf32["images_per_second"]
    summary = ", ".join(
        f"{c['precision']} {c['images_per_second']:,.0f} img/s {c['speedup_vs_fp32']:.2f}x "
        f"busy {c['device_busy']:.0%} syncs {c['host_syncs_per_step']:.1f}"
        for c in cells
    )
    log.info("%s (%s): %s", name, what, summary)
    return {"rung": name, "change": what, "batch": cfg.train.batch_size, "cells": cells}


def _measured_apart(args, opts: dict, names: list[str], out: Path) -> list[dict]:
    """`names` measured by `ampbench explain --rungs ...` in a fresh process."""
    if not names:
        return []
    part = out.with_name(out.name + "-part")
    command = [sys.executable, "-m", "ampbench", "explain", "--params", args.params]
    command += [x for o in args.overrides for x in ("--set", o)]
    for flag, key in (("--steps", "steps"), ("--windows", "windows"), ("--profile-steps", "profile_steps")):
        command += [flag, str(opts[key])]
    command += ["--max-images", str(opts["max_images"]), "--rungs", ",".join(names), "--out", str(part)]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"measuring {', '.join(names)} apart failed: {shlex.join(command)}")
    rungs = json.loads(part.with_suffix(".json").read_text())["rungs"]
    part.with_suffix(".json").unlink()
    return rungs


def to_markdown(res: dict) -> str:
    lines = [f"# Why AMP pays or not: {res['hardware']}", ""]
    if res["note"]:
        lines += [f"**{res['note']}**", ""]
    o, vs_tf32 = res["options"], any("speedup_vs_tf32" in c for r in res["rungs"] for c in r["cells"])
    lines += [
        f"TF32 off{' but in the tf32 cells' if vs_tf32 else ''}. "
        f"Per cell: {o['windows']} windows of {o['steps']} steps after a warm-up epoch, "
        f"images/s as median (min–max); device busy and host syncs from torch.profiler over "
        f"{o['profile_steps']} steps; energy from NVML's counter "
        f"({'present' if res['energy_counter'] else 'n/a here'}). "
        f"MLflow run: {res.get('run_id') or 'not recorded'}.",
        "",
        "| rung | change | batch | precision | images/s | min–max | ms/step | speed-up vs fp32 "
        + ("| vs tf32 " if vs_tf32 else "")
        + "| device busy | host syncs/step | peak MB | TFLOP/s | J/image |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if vs_tf32 else ""),
    ]
    for r in res["rungs"]:
        for i, c in enumerate(r["cells"]):
            change = r["change"] if i == 0 else ""
            joules = "n/a" if c["joules_per_image"] is None else f"{c['joules_per_image'] * 1e3:.3f} m"
            ips, lo, hi = (
                f"{c[k]:,.0f}"
                for k in ("images_per_second", "images_per_second_min", "images_per_second_max")
            )
            lines.append(
                f"| {r['rung']} | {change} | {r['batch']} | {c['precision']} | {ips} | {lo}–{hi} "
                f"| {c['ms_per_step']:.2f} | {c['speedup_vs_fp32']:.2f}x "
                + (f"| {c['speedup_vs_tf32']:.2f}x " if vs_tf32 else "")
                + f"| {c['device_busy']:.0%} "
                f"| {c['host_syncs_per_step']:.1f} "
                f"| {c['peak_memory_mb']:,.0f} | {c['tflops']:.1f} | {joules} |"
            )
    lines += [
        "",
        _self_check(
            f"{r['rung']} {c['precision']}" for r in res["rungs"] for c in r["cells"] if c.get("noisy")
        ),
    ]
    cross = res.get("crossover")
    if cross:
        names = [k for k in cross["rows"][0] if k != "batch"]
        lines += [
            "",
            "Batch crossover (the defaults' bare step, images/s):",
            "",
            "| batch | " + " | ".join(names) + " | autocast / fp32 |",
        ]
        lines.append("|---" * (len(names) + 2) + "|")
        for row in cross["rows"]:
            vals = " | ".join(f"{row[n]:,.0f}" for n in names)
            lines.append(f"| {row['batch']} | {vals} | {row['autocast'] / row['fp32']:.2f}x |")
        lines += [
            "",
            f"Autocast reaches 1.5x fp32 {_from_batch(cross, 'autocast_1_5x_from_batch')}, "
            f"2x {_from_batch(cross, 'autocast_2x_from_batch')}.",
        ]
    return "\n".join(lines) + "\n"


def _self_check(noisy) -> str:
    """One line: every measure steady, or which are noisy (report/selfcheck.py)."""
    noisy = list(noisy)
    if not noisy:
        return "Self-check: every cell's windows within 5% of their mean (CV)."
    return (
        f"Self-check: noisy (windows vary more than 5%, CV): {', '.join(noisy)}; re-run on a quiet machine."
    )


def _from_batch(cross: dict, key: str) -> str:
    tried = [r["batch"] for r in cross["rows"]]
    return f"from batch {cross[key]}" if cross[key] else f"at no batch tried ({tried[0]}–{tried[-1]})"


def write(res: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(to_markdown(res))
    from ampbench.report.explain_chart import draw

    draw(res, out.with_suffix(".png"))


def track(cfg, res: dict, out: Path) -> str | None:
    """One MLflow run in `<tracking.experiment>-explain`: the figures as metrics, the files."""
    from ampbench.tracking.tracker import KIND_TAG, Tracker

    t, tracker, run_id = cfg.tracking, None, None
    try:
        tracker = Tracker(f"{t.experiment}-explain", t.preflight_timeout_s, t.request_timeout_s)
        tracker.preflight()
        run_id = tracker.start(
            "explain", {KIND_TAG: "explain"}, {"hardware": res["hardware"], "device_type": res["device_type"]}
        )
        metrics = {}
        for r in res["rungs"]:
            for c in r["cells"]:
                key = f"explain/{r['rung']}/{c['precision']}"
                metrics.update(
                    {
                        f"{key}/images_per_second": c["images_per_second"],
                        f"{key}/speedup_vs_fp32": c["speedup_vs_fp32"],
                    }
                )
        tracker.log_metrics(run_id, metrics)
        write({**res, "run_id": run_id}, out)
        for suffix in (".json", ".md", ".png"):
            tracker.log_artifact(run_id, out.with_suffix(suffix))
        tracker.end(run_id, "FINISHED")
        return run_id
    except Exception as err:  # the store failed: the measurement stays in the files
        from ampbench.tracking import store

        log.error(
            "explain not recorded in MLflow: %s. The results are in %s.json",
            store.store_fault(err) or err,
            out,
        )
        if run_id and tracker is not None:
            tracker.end_quietly(run_id, "FAILED")
        return None
