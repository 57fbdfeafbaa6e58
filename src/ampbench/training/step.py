"""One training step, the same for every variant, and the device-side statistics it keeps.

The step never syncs the host: loss, hits, non-finite losses and GradScaler skips accumulate in
one small device tensor (``Stats``) that is read once per epoch. The precision's run state
(``precision.PrecisionRun``) owns loss scaling: the step asks it to backpropagate and to step the
optimizer. On CUDA the whole step (forward, backward, scaler, fused SGD) is replayed from a CUDA
graph where the parallel strategy allows it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

import torch
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class Totals:
    """An epoch's statistics, read from the device once (names, not indices)."""

    loss_sum: float = 0.0  # summed over images of finite-loss steps
    correct: float = 0.0
    count: float = 0.0
    nonfinite: float = 0.0  # steps whose loss was inf/NaN
    skipped: float = 0.0  # steps GradScaler skipped
    first_bad: float = -1.0  # step index of the first non-finite loss, -1: none
    step: float = 0.0  # steps taken this epoch
    finite: float = 0.0  # images in finite-loss steps


_I = {f.name: i for i, f in enumerate(fields(Totals))}

# One warm-up and capture stream per device for the whole process. torch gives every stream that runs a matmul
# cuBLAS and cuBLASLt workspaces of its own (~65 MiB on an H100), kept for the life of the process
# and counted as allocated memory: a new stream per warm-up step made each seed's peak memory grow
# by its warm-up steps' workspaces (+195 MiB a seed for 3 steps, +715 MiB for DDP's 11).
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The process's warm-up stream on ``device`` (eager steps before a CUDA graph's capture)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


class Stats:
    """The per-epoch device accumulator behind ``Totals`` (float64: exact counts for any epoch)."""

    def __init__(self, device: torch.device) -> None:
        self.tensor = torch.zeros(len(_I), dtype=torch.float64, device=device)
        self.reset()

    def reset(self, saved: list[float] | None = None) -> None:
        """Zero (first_bad -1), or the values a mid-epoch checkpoint saved."""
        if saved is not None:
            self.tensor.copy_(torch.as_tensor(saved, dtype=torch.float64))
            return
        self.tensor.zero_()
        self.tensor[_I["first_bad"]] = -1

    def add(self, loss: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, skipped) -> None:
        """Account one step, on the device (no host sync; capturable in a CUDA graph)."""
        s, bad, n = self.tensor, ~torch.isfinite(loss), len(labels)
        s[_I["loss_sum"]] += torch.where(bad, 0.0, loss.detach().double()) * n
        s[_I["correct"]] += (out.argmax(1) == labels).sum()
        s[_I["count"]] += n
        s[_I["nonfinite"]] += bad
        s[_I["finite"]] += torch.where(bad, 0, n)
        if skipped is not None:
            s[_I["skipped"]] += skipped
        first = s[_I["first_bad"]]
        s[_I["first_bad"]] = torch.where(bad & (first < 0), s[_I["step"]], first)
        s[_I["step"]] += 1

    def totals(self, strategy) -> Totals:
        """Summed over processes, read once. first_bad and skipped stay this rank's: every rank's
        scaler sees the same all-reduced gradients, so summing would count a skip world_size times."""
        summed = strategy.all_sum(self.tensor.clone())
        for name in ("first_bad", "skipped"):
            summed[_I[name]] = self.tensor[_I[name]]
        return Totals(*summed.tolist())

    def snapshot(self) -> list[float]:
        """This rank's values, for a mid-epoch checkpoint (a host sync)."""
        return self.tensor.tolist()


class Step:
    """One training step, run eagerly or replayed from a captured CUDA graph."""

    def __init__(self, trainer, criterion: nn.Module, stats: Stats, warmup_steps: int) -> None:
        self.model, self.opt, self.precision = trainer.model, trainer.opt, trainer.precision
        self.criterion, self.stats, self.use_graph = criterion, stats, trainer.use_graph
        self.warmup_steps = warmup_steps  # eager steps before capture (the strategy's)
        self.compiler, self.device = trainer.compiler, trainer.device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self.fallback = ""  # why a model could not be captured (then the step runs eagerly)

    def _run(self, images, labels) -> None:
        self.opt.zero_grad(set_to_none=True)
        out = self.model(images)  # autocast, where the precision has one, is entered in forward
        loss = self.criterion(out, labels)
        self.precision.backward(loss)
        skipped = self.precision.optimizer_step(self.opt)  # device tensor or None: no host sync
        with torch.no_grad():
            self.stats.add(loss, out, labels, skipped)

    def __call__(self, images, labels) -> None:
        """One step on this batch: eager, a warm-up before capture, or a replay of the graph."""
        self.calls += 1
        if self.calls == 1 and self.compiler.enabled:  # inductor compiles now: timed apart
            return self.compiler.first_step(lambda: self._before_capture(images, labels), self.device)
        if self.graph is None and (not self.use_graph or self.calls <= self.warmup_steps):
            return self._before_capture(images, labels)
        if self.graph is None and not self._capture(images, labels):
            return None  # not capturable: this step (and every later one) ran eagerly
        assert self.graph is not None  # for the type checker: _capture set it
        self.static[0].copy_(images)
        self.static[1].copy_(labels)
        self.graph.replay()
        return None

    def _before_capture(self, images, labels) -> None:
        """An eager step; with a graph to capture, a warm-up on a side stream (as capture needs)."""
        if not self.use_graph:
            return self._run(images, labels)
        side = side_stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(images, labels)
        torch.cuda.current_stream().wait_stream(side)
        return None

    def _capture(self, images, labels) -> bool:
        """Capture the step; False (and this step run eagerly) if the model cannot be captured:
        any model may do what a graph cannot hold (a host sync, a data-dependent shape)."""
        if not isinstance(self.opt.param_groups[0]["lr"], torch.Tensor):
            raise RuntimeError("CUDA graph needs a tensor learning rate (set train.cuda_graph false)")
        self.static = (images.clone(), labels.clone())
        self.graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: other threads (DataLoader pin-memory, NCCL watchdog, the metrics
            # sender) may touch CUDA while this one captures; in global mode that breaks the capture.
            # on the warm-up stream, where DDP was built (parallel.Distributed.wrap)
            side = side_stream(self.device)
            with torch.cuda.graph(self.graph, stream=side, capture_error_mode="thread_local"):
                self._run(*self.static)
        except RuntimeError as err:
            self.graph, self.use_graph = None, False
            self.fallback = " ".join(str(err).split())[:200]
            log.warning(
                "this model cannot be captured in a CUDA graph (%s); it trains eagerly, as with "
                "train.cuda_graph false (recorded: cuda_graph_used false, cuda_graph_fallback)",
                self.fallback,
            )
            torch.cuda.synchronize()
            self._run(images, labels)
            return False
        return True

    def graph_facts(self) -> dict:
        """Whether the step really ran from a CUDA graph, and why not where capture failed."""
        return {
            "cuda_graph_used": self.use_graph,
            **({"cuda_graph_fallback": self.fallback} if self.fallback else {}),
        }


def epoch_metrics(totals: Totals, seconds: float, lr: float, scale: float, joules: float | None) -> dict:
    """The epoch's record (flat keys; tracking maps them to MLflow's sectioned names); its energy
    only where measured (`energy.Energy`)."""
    measured = {} if joules is None else {"epoch_joules": joules}
    return {
        **measured,
        "train_loss": totals.loss_sum / totals.finite if totals.finite else math.nan,  # finite-loss steps
        "train_accuracy": totals.correct / max(1, totals.count),
        "epoch_seconds": seconds,
        "epoch_images_per_second": totals.count / seconds,
        "lr": lr,
        "grad_scale": scale,
        "skipped_steps": totals.skipped,
        "nonfinite_losses": totals.nonfinite,
    }
