"""The measuring kit every measurement here is made with: a trainer built as the train stage builds
it, a clock read only after the device has finished its queued work, the untimed warm-up a trainer
needs, and the model's FLOPs counted. `throughput` (ampbench bench) and `rungs` (ampbench explain)
are made of these."""

from __future__ import annotations

import itertools
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from ampbench.training import build, measure, parallel, precision


def train_flops_per_image(cfg, num_classes: int) -> float:
    """Model FLOPs of one forward + backward, per image (counted, not assumed)."""
    model = build.build_model(cfg, num_classes, torch.device("cpu"))
    size = cfg.data.image_size
    x = torch.randint(0, 255, (2, 3, size, size), dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def clock(device) -> float:
    """perf_counter after the device has finished all queued work (so the reading means it)."""
    measure.sync(device)
    return time.perf_counter()


def seconds(fn, calls: int, device) -> float:
    """Wall seconds of `calls` calls of fn, device work included."""
    t0 = clock(device)
    for _ in range(calls):
        fn()
    return clock(device) - t0


def epochs(batches, first: int):
    """Batches of epochs first, first + 1, ... without end (each epoch reshuffles and re-augments)."""
    return (b for e in itertools.count(first) for b in batches.epoch(e))


def warm_steps(step, warmup: int) -> int:
    """Untimed steps before a trainer's first window: `warmup`, or more where a CUDA graph needs them."""
    # With a CUDA graph, at least its eager warm-up steps plus the capture stay out of every
    # window. With train.cudnn_benchmark those eager steps also run cuDNN's algorithm search for
    # the one batch shape there is (the loaders drop the last partial batch), so no capture
    # records a search and no window pays for one.
    return max(warmup, step.warmup_steps + 1) if step.use_graph else warmup


def trainer(cfg, variant: str, dataset: dict, strategy):
    """(the training step, its facts) of `variant` as the train stage builds it, seeded alike."""
    prec = precision.REGISTRY[variant.split("-", 1)[1]]
    torch.manual_seed(0)
    built = build.setup(cfg, prec, strategy, len(dataset["classes"]), 10**6)
    return build.make_step(built, cfg, strategy), built.facts


def dataset(max_images: int = 0) -> dict:
    """The prepared dataset (``ampbench download``), its train split cut to the first `max_images`
    images when that is above 0."""
    from ampbench.data import prepared
    from ampbench.paths import DATA_FILE

    data = prepared.load_dataset(DATA_FILE)
    if max_images > 0:
        n = max_images
        data.update(train_images=data["train_images"][:n], train_labels=data["train_labels"][:n])
    return data


def single_device():
    """The `single` strategy set up on this machine's first device, TF32 off (as in training)."""
    strategy = parallel.make("single")
    strategy.setup()
    precision.disable_tf32()
    return strategy
