"""What the study costs on this machine: its work counted in training steps, and ``ampbench estimate``.

The work of a seed is counted in training steps (evaluations converted at a forward pass's share
of a step); what is left of a variant is judged from the models and checkpoints on disk.
``progress.StageProgress`` turns these counts into times once it has measured a step.

``measure_step_seconds`` and ``preflight`` serve ``ampbench estimate``: a few steps of the real
model on random tensors (no dataset needed), before ``make run`` starts on a machine without CUDA.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ampbench.config import PRECISIONS, Config, ConfigError
from ampbench.training import memory_check
from ampbench.training.measure import sync
from ampbench.variants import study_variants

CIFAR_TRAIN_PER_CLASS, CIFAR_TEST_PER_CLASS, CIFAR_CLASSES = 5000, 1000, 10
# A forward pass costs about a third of a training step (forward + backward + update), per image.
FORWARD_SHARE = 1 / 3
# The largest batch an fp32 step is timed at (per image, scaled): a larger one takes minutes on a CPU.
FP32_PROBE_BATCH = 1024
LONG_ON_CPU_S = 30 * 60  # a study longer than this on a CPU gets the `make demo` hint
DEMO_HINT = (
    "This is long for a CPU. The quick study runs the same pipeline (nine variants, "
    "evaluation, comparison, MLflow) on a subset in a few minutes: `make demo`."
)


def long_on_cpu_hint(device_type: str, variant: str, study_seconds: float) -> str:
    """The pointer to `make demo` where the study is long on a CPU, else ""."""
    if device_type != "cpu" or study_seconds <= LONG_ON_CPU_S:
        return ""
    if not variant.endswith("fp32"):
        return DEMO_HINT
    return (
        f"{DEMO_HINT} On CPUs without native bfloat16 (AVX2 only) the autocast variants run several "
        "times slower than fp32: `ampbench estimate` measures both."
    )


def fmt_step(seconds: float) -> str:
    """A step's time as a reader takes it in: `1.51 ms` on a GPU, `0.412 s` on a CPU."""
    return f"{seconds * 1000:.2f} ms" if seconds < 0.1 else f"{seconds:.3f} s"


def fmt_duration(seconds: float) -> str:
    """3 s, 4 min 10 s, 2 h 05 min, 3 d 4 h."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def dataset_sizes(cfg: Config) -> tuple[int, int]:
    """Train and test images the configured (sub)set of CIFAR-10 holds."""
    d = cfg.data
    return (
        (d.train_per_class or CIFAR_TRAIN_PER_CLASS) * CIFAR_CLASSES,
        (d.test_per_class or CIFAR_TEST_PER_CLASS) * CIFAR_CLASSES,
    )


def eval_steps(cfg: Config, n_test: int) -> float:
    """One test-set evaluation in units of training steps (forward only, twice with flip)."""
    return n_test * (2 if cfg.train.eval_flip else 1) * FORWARD_SHARE / cfg.train.batch_size


def seed_work(cfg: Config, steps_per_epoch: int, epoch: int = 0, step: int = 0) -> tuple[int, int]:
    """(training steps, test evaluations) one seed still needs from (epoch, step): one evaluation
    per epoch left (`train.eval_each_epoch`), else the last epoch's only."""
    t = cfg.train
    train = max(0, (t.epochs - epoch) * steps_per_epoch - step)
    evals = (t.epochs - epoch) if t.eval_each_epoch else int(epoch < t.epochs)
    return train, evals


def seed_steps(cfg: Config, steps_per_epoch: int, n_test: int, epoch: int = 0, step: int = 0) -> float:
    """Training steps plus evaluations (in step units) one seed still needs from (epoch, step)."""
    train, evals = seed_work(cfg, steps_per_epoch, epoch, step)
    return max(0.0, train + evals * eval_steps(cfg, n_test))


def _saved_position(path: Path, digest: str) -> tuple[int, int] | None:
    """(epoch, step) of a model.pt (done: epochs) or checkpoint.pt of this config, else None."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    if saved.get("config_digest") != digest:
        return None
    if "state_dict" in saved:  # a finished model
        return (10**9, 0)
    return int(saved.get("epoch", 0)), int(saved.get("step", 0))


def remaining_seed_steps(
    cfg: Config, variant: str, seed: int, steps_per_epoch: int, n_test: int, models_dir: Path, work_dir: Path
) -> float:
    """What one variant's seed still needs, judged from the models and checkpoints on disk."""
    digest = cfg.digest()
    for path in (
        models_dir / variant / f"seed-{seed}" / "model.pt",
        work_dir / variant / f"seed-{seed}" / "model.pt",
        work_dir / variant / f"seed-{seed}" / "checkpoint.pt",
    ):
        if path.exists():
            pos = _saved_position(path, digest)
            if pos is not None:
                if pos[0] >= cfg.train.epochs:
                    return 0.0
                return seed_steps(cfg, steps_per_epoch, n_test, *pos)
    return seed_steps(cfg, steps_per_epoch, n_test)


# --- `ampbench estimate`: before the study starts ------------------------------------------------
def measure_step_seconds(
    cfg: Config, precision_name: str, batch: int, steps: int = 2, warmup: int = 1, device: str = "cpu"
) -> float:
    """Seconds per training step of the configured model (the one factory), on random uint8 images
    of the configured size (CIFAR-10's class count)."""
    from ampbench.training import factory, precision

    dev = torch.device(device)
    torch.manual_seed(0)
    size = cfg.data.image_size
    raw = factory.build(cfg.model, CIFAR_CLASSES, size).to(dev)
    run = precision.REGISTRY[precision_name].setup(raw, dev)
    model = run.wrap(raw)
    opt = torch.optim.SGD(raw.parameters(), lr=1e-3, momentum=cfg.train.momentum, nesterov=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, CIFAR_CLASSES, (batch,), device=dev)

    def one() -> None:
        opt.zero_grad(set_to_none=True)
        run.backward(loss_fn(model(images), labels))
        run.optimizer_step(opt)

    for _ in range(warmup):
        one()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    sync(dev)
    return (time.perf_counter() - t0) / steps


def preflight(
    cfg: Config,
    params_file: str | Path = "params.yaml",
    probe_batch: int = 8,
    force: bool = False,
    sizes: tuple[int, int] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> dict | None:
    """Estimate the whole study on this CPU from a few timed steps; None when CUDA is present."""
    if torch.cuda.is_available() and not force:
        print("CUDA is available: every train stage logs its expected time after its first steps.")
        return None
    memory_check.check_fits(cfg, torch.device("cpu"), CIFAR_CLASSES)  # before any model is built
    t0 = time.perf_counter()
    n_train, n_test = sizes or dataset_sizes(cfg)  # the prepared data's, where it matches the settings
    batch = cfg.train.batch_size
    if batch > n_train:  # the train stage refuses it too (training/loader.check_batch): said once, here
        raise ConfigError(
            f"train.batch_size={batch} is larger than the train set ({n_train:,} images); lower "
            "train.batch_size or raise data.train_per_class"
        )
    spe = n_train // batch
    variants = study_variants(params_file, overrides)
    seeds = len(cfg.train.seeds)
    per_image: dict[str, float] = {}
    for name in sorted({v.split("-", 1)[1] for v in variants}, key=PRECISIONS.index):
        if name == "autocast_gradscaler" and "autocast" in per_image:
            per_image[name] = per_image["autocast"]  # same kernels; the scaler adds little
            continue
        # fp32 at the real batch up to FP32_PROBE_BATCH (a few seconds); autocast at a small batch,
        # scaled: on a CPU without native bfloat16 one real-batch step can take minutes.
        b = min(batch, FP32_PROBE_BATCH) if name == "fp32" else min(batch, probe_batch)
        per_image[name] = measure_step_seconds(cfg, name, b, steps=1) / b
    per_seed = seed_steps(cfg, spe, n_test)
    total = sum(per_seed * seeds * per_image[v.split("-", 1)[1]] * batch for v in variants)
    by_precision = ", ".join(f"{k} {v * batch:.2f} s" for k, v in per_image.items())
    lines = [
        f"No CUDA: this is the full study on a CPU: {len(variants)} variants x {seeds} seeds x "
        f"{cfg.train.epochs} epochs x {spe} steps of {batch} images.",
        f"Measured here (a few steps of the real model, {time.perf_counter() - t0:.0f} s): "
        f"{by_precision} per step"
        + (
            f" (autocast timed at a batch of {min(batch, probe_batch)} and scaled: rough)."
            if len(per_image) > 1 or "fp32" not in per_image
            else "."
        ),
        f"Expected time of the study on this machine: about {fmt_duration(total)} "
        "(each train stage logs a measured estimate after its first steps).",
    ]
    if total > LONG_ON_CPU_S:
        lines.append(DEMO_HINT)
    print("\n".join(lines), flush=True)
    return {"study_seconds": total, "step_seconds": {k: v * batch for k, v in per_image.items()}}
