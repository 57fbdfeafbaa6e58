"""`ampbench bench`: training throughput of chosen variants, untracked, against two references.

    ampbench bench --variants single-fp32,single-autocast,single-autocast_gradscaler --batch-size 512

For each variant (``single`` or ``dp``) at one batch size, in one process:
- **pipeline**: the real training loop (device-resident data and augmentation, the same step the
  ``train`` stage runs), timed over one full epoch after a warm-up;
- **ceiling**: the bare training step replayed from a CUDA graph on one fixed, resident batch
  (on CPU: the eager step on a fixed batch), the most this model and batch can do here;
- **dataloader** (once, in the last variant's precision): the tutorial's input pipeline, a torch
  DataLoader with PIL-based torchvision transforms and ``--workers`` workers, feeding that step.

Clocks are read only after ``torch.cuda.synchronize``; warm-up steps (graph capture, cuDNN
autotuning, worker start-up) are excluded and reported separately. TF32 is off, as in training.
Writes ``<out>.md`` and ``<out>.json``. With ``--profile N`` it also lists the time per kernel (CPU:
per operator) of N ceiling steps per variant, from torch.profiler: where the step's time goes.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from ampbench import data, engine, loader, parallel, precision
from ampbench.config import replace

log = logging.getLogger(__name__)

PROFILE_ROWS = 25  # kernels listed per profiled variant in the markdown (the JSON has all)


def train_flops_per_image(cfg, num_classes: int) -> float:
    """Model FLOPs of one forward + backward, per image (counted, not assumed)."""
    model = engine.build_model(cfg, num_classes, torch.device("cpu"))
    x = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def _timed(fn, steps: int, warmup: int, device) -> tuple[float, float]:
    """(seconds per step, warm-up seconds); the device is synchronised before each clock read."""
    engine.sync(device)
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    engine.sync(device)
    t1 = time.perf_counter()
    for _ in range(steps):
        fn()
    engine.sync(device)
    return (time.perf_counter() - t1) / steps, t1 - t0


def _trainer(cfg, variant: str, dataset: dict, strategy):
    prec = precision.PRECISIONS[variant.split("-", 1)[1]]
    torch.manual_seed(0)
    if strategy.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = engine.setup(cfg, prec, strategy, 10, 10**6)
    return engine.make_step(trainer, cfg, strategy), trainer.facts


def _row(what, variant, batch, sec, warm, flops, device, facts) -> dict:
    ips = batch / sec
    peak = (
        torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else engine.peak_memory_mb(device)
    )
    return {"measure": what, "variant": variant, "batch": batch, "images_per_second": ips,
            "ms_per_step": sec * 1e3, "warmup_seconds": warm, "tflops": ips * flops / 1e12,
            "peak_memory_mb": peak, "amp_dtype": facts["amp_dtype"],
            "cuda_graph": facts["cuda_graph_used"]}  # fmt: skip


def kernel_profile(fn, steps: int, device) -> dict:
    """Time per step by kernel (CUDA, via CUPTI) or by operator (CPU), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    engine.sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        engine.sync(device)
    kernels = []
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            kernels.append({"kernel": e.key, "us_per_step": us / steps, "calls_per_step": e.count / steps})
    kernels.sort(key=lambda k: -k["us_per_step"])
    return {"steps": steps, "busy_ms_per_step": sum(k["us_per_step"] for k in kernels) / 1e3,
            "kernels": kernels}  # fmt: skip


def run(cfg, variants: list[str], dataset: dict, steps: int, warmup: int, workers: int,
        profile_steps: int = 0) -> dict:  # fmt: skip
    batch = cfg.train.batch_size
    flops = train_flops_per_image(cfg, len(dataset["classes"]))
    rows, profiles = [], {}
    for variant in variants:
        strategy = parallel.make(variant.split("-", 1)[0])
        device = strategy.setup()
        precision.disable_tf32()
        # Pipeline: the real loader and step, one full epoch after `warmup` steps of another.
        step, facts = _trainer(cfg, variant, dataset, strategy)
        batches = loader.make("device", dataset, batch, strategy, 0, 0)
        warm_iter = batches.epoch(0)
        for _ in range(min(warmup, len(batches))):
            step(*next(warm_iter))
        epoch_iter = batches.epoch(1)
        sec, _ = _timed(lambda s=step, it=epoch_iter: s(*next(it)), len(batches), 0, device)
        rows.append(_row("pipeline", variant, batch, sec, 0.0, flops, device, facts))
        # Ceiling: the bare step on one fixed, resident batch (graph-replayed on CUDA).
        step, facts = _trainer(cfg, variant, dataset, strategy)
        x, y = next(batches.epoch(2))
        # At least the graph's eager warm-up steps plus its capture stay out of the timed steps.
        warm_steps = max(warmup, step.warmup_steps + 1)
        sec, warm = _timed(lambda s=step, b=(x, y): s(*b), steps, warm_steps, device)
        rows.append(_row("ceiling", variant, batch, sec, warm, flops, device, facts))
        if profile_steps:
            profiles[variant] = kernel_profile(lambda s=step, b=(x, y): s(*b), profile_steps, device)
            profiles[variant]["ms_per_step"] = sec * 1e3
        log.info("%s: pipeline %.0f img/s, ceiling %.0f img/s", variant, rows[-2]["images_per_second"],
                 rows[-1]["images_per_second"])  # fmt: skip
    # Reference: the tutorial's DataLoader pipeline feeding the same step (last variant).
    step, facts = _trainer(cfg, variants[-1], dataset, strategy)
    tl = loader.TorchLoader(dataset["train_images"], dataset["train_labels"], batch, 0, 1, device, 0, workers)
    it = (b for e in range(10**6) for b in tl.epoch(e))
    sec, warm = _timed(lambda: step(*next(it)), steps, warmup, device)
    rows.append(_row(f"dataloader ({workers} workers)", variants[-1], batch, sec, warm, flops, device, facts))
    ceilings = {r["variant"]: r["images_per_second"] for r in rows if r["measure"] == "ceiling"}
    for r in rows:
        r["fraction_of_ceiling"] = r["images_per_second"] / ceilings[r["variant"]]
    return {"hardware": strategy.facts()["device_name"], "torch": torch.__version__,
            "tf32": False, "batch": batch, "steps": steps, "warmup": warmup,
            "gflop_per_image": flops / 1e9, "rows": rows, "profiles": profiles}  # fmt: skip


def to_markdown(res: dict) -> str:
    lines = [
        f"Hardware: {res['hardware']}; torch {res['torch']}; TF32 off; batch {res['batch']}; "
        f"{res['gflop_per_image']:.3f} GFLOP per training image (counted); timed steps {res['steps']} "
        f"after {res['warmup']} warm-up steps (pipeline: one full epoch after warm-up).",
        "",
        "| measure | variant | amp dtype | images/s | ms/step | of ceiling | TFLOP/s | peak MB | warm-up s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['measure']} | {r['variant']} | {r['amp_dtype']} | {r['images_per_second']:,.0f} "
            f"| {r['ms_per_step']:.2f} | {r['fraction_of_ceiling']:.0%} | {r['tflops']:.1f} "
            f"| {r['peak_memory_mb']:,.0f} | {r['warmup_seconds']:.2f} |"
        )
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
        lines += [f"| `{k['kernel'][:100]}` | {k['us_per_step']:.1f} | {k['calls_per_step']:g} |"
                  for k in p["kernels"][:PROFILE_ROWS]]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(cfg, args, data_file: Path) -> dict:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    in_process = [name for name, s in parallel.STRATEGIES.items() if s.in_process]
    bad = [v for v in variants if v.split("-", 1)[0] not in in_process
           or v.split("-", 1)[-1] not in precision.PRECISIONS]  # fmt: skip
    if bad:
        raise ValueError(f"--variants: {', '.join(bad)} not benchmarkable (in-process variants only: "
                         f"{', '.join(p + '-*' for p in in_process)})")  # fmt: skip
    if args.batch_size:
        cfg = replace(cfg, train={"batch_size": args.batch_size})
    dataset = data.load_dataset(data_file)
    if args.max_images:
        n = args.max_images
        dataset.update(train_images=dataset["train_images"][:n], train_labels=dataset["train_labels"][:n])
    res = run(cfg, variants, dataset, args.steps, args.warmup, args.workers, args.profile)
    res["train_images"] = len(dataset["train_labels"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(to_markdown(res))
    print(to_markdown(res))
    return res
