"""The batch crossover of `ampbench explain`: the defaults' bare step (one resident batch,
graph-replayed on CUDA) over batch sizes, and from which batch autocast pays 1.5x and 2x fp32."""

from __future__ import annotations

import logging
import statistics

from ampbench.config import replace
from ampbench.measuring import kit, pace
from ampbench.measuring.rungs import precisions

log = logging.getLogger(__name__)


def measure(cfg, dataset: dict, strategy, batches_to_try: list[int], opts: dict) -> dict:
    """Images/s of the defaults' bare step (one resident batch, graph-replayed on CUDA) per batch
    and precision; the smallest batch where autocast reaches 1.5x and 2x fp32."""
    device, rows = strategy.device, []
    for batch in batches_to_try:
        c = replace(cfg, train={"batch_size": batch})
        x = dataset["train_images"][:batch].to(device)
        y = dataset["train_labels"][:batch].to(device)
        row = {"batch": batch}
        for name in precisions(device):
            pace.between("crossover batch %d: timing %s", batch, name)
            row[name] = _ceiling(c, name, dataset, strategy, x, y, opts["steps"])
        rows.append(row)
        said = ", ".join(f"{name} {row[name]:,.0f}" for name in precisions(device))
        log.info("crossover batch %d: %s img/s", batch, said)  # a line per batch: minutes on a CPU

    def first(ratio: float) -> int | None:
        return next((r["batch"] for r in rows if r["autocast"] >= ratio * r["fp32"]), None)

    return {"rows": rows, "autocast_1_5x_from_batch": first(1.5), "autocast_2x_from_batch": first(2.0)}


def _ceiling(cfg, name: str, dataset: dict, strategy, x, y, steps: int) -> float:
    """Images/s of the bare step on one resident batch: the median of 3 windows after warm-up."""
    device = strategy.device
    step, _ = kit.trainer(cfg, f"single-{name}", dataset, strategy)

    def once() -> None:
        step(x, y)

    kit.seconds(once, kit.warm_steps(step, 3), device)
    secs = []
    for w in range(3):  # a line between windows on a slow CPU (final pass G: 33 s silent)
        pace.between("crossover batch %d: %s window %d of 3", len(y), name, w + 1)
        secs.append(kit.seconds(once, steps, device) / steps)
    return len(y) / statistics.median(secs)
