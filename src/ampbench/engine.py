"""The training core: one loop for all nine precision x parallel variants. Imports no mlflow.

``train_seed`` trains one seed. Precision and parallelism arrive as small strategy objects, so the
step has no per-variant branches. The hot loop does not sync the host (DDP ranks agree on
stopping every `train.stop_check_every` steps, one small all-reduce): loss, accuracy, non-finite
losses and GradScaler skips accumulate in one device tensor that is read once per epoch. On CUDA
the whole step (forward, backward, scaler, fused SGD) is replayed from a CUDA graph wherever the
parallel strategy allows it (``strategy.capturable()``).

Whatever happens, ``hooks`` hears about it (rank 0 records it in MLflow) and a checkpoint is
written atomically at every epoch end, so a crash loses at most the current epoch.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ampbench import checkpoint, loader, precision
from ampbench.config import Config
from ampbench.model import AlexNet, DtypeProbe, autocast_outside, forward_context

log = logging.getLogger(__name__)

# Layout of the per-epoch device accumulator.
LOSS, CORRECT, COUNT, NONFINITE, SKIPPED, FIRST_BAD, STEP, FINITE = range(8)
STATS_SIZE = 8


class Stopped(Exception):
    """Training stopped on request (SIGTERM / Ctrl-C) after saving a checkpoint."""


@dataclass
class Job:
    cfg: Config
    precision: precision.Precision
    strategy: object  # a parallel strategy
    data: dict
    seed: int
    checkpoint_path: Path
    stop_requested: Callable[[], bool] = lambda: False
    progress: object | None = None  # progress.StageProgress: stage bar and time estimates


class NullHooks:
    def on_epoch(self, epoch: int, metrics: dict) -> None:
        pass


def build_model(cfg: Config, num_classes: int, device: torch.device) -> nn.Module:
    model = AlexNet(cfg.model, num_classes).to(device)
    if device.type == "cuda" and cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


class Step:
    """One training step, run eagerly or replayed from a captured CUDA graph."""

    def __init__(self, model, opt, scaler, criterion, stats, device, use_graph, warmup_steps):
        self.model, self.opt, self.scaler, self.criterion = model, opt, scaler, criterion
        self.stats, self.device, self.use_graph = stats, device, use_graph
        self.warmup_steps = warmup_steps  # eager steps before capture (the strategy's)
        self.graph, self.calls = None, 0
        self.forward_context = forward_context(model)  # nullcontext unless the claim-4 demonstration

    def _run(self, images, labels) -> None:
        self.opt.zero_grad(set_to_none=True)
        with self.forward_context():
            out = self.model(images)
            loss = self.criterion(out, labels)
        self.scaler.scale(loss).backward()
        # Unscale explicitly: one pass checks and unscales the gradients. Left to step(), the
        # scaler makes a check-only pass and fused SGD then unscales and writes every gradient
        # again (profiled on an H200: 0.14 ms per step instead of 0.08). No-op when disabled.
        self.scaler.unscale_(self.opt)
        self.scaler.step(self.opt)
        skipped = precision.found_inf(self.scaler, self.opt)  # read before update() resets it
        self.scaler.update()
        with torch.no_grad():
            s, bad = self.stats, ~torch.isfinite(loss)
            s[LOSS] += torch.where(bad, 0.0, loss.detach().double()) * len(labels)
            s[CORRECT] += (out.argmax(1) == labels).sum()
            s[COUNT] += len(labels)
            s[NONFINITE] += bad
            s[FINITE] += torch.where(bad, 0, len(labels))
            if skipped is not None:
                s[SKIPPED] += skipped
            s[FIRST_BAD] = torch.where(bad & (s[FIRST_BAD] < 0), s[STEP], s[FIRST_BAD])
            s[STEP] += 1

    def __call__(self, images, labels) -> None:
        self.calls += 1
        if not self.use_graph:
            return self._run(images, labels)
        if self.graph is None and self.calls <= self.warmup_steps:
            # Warm-up on a side stream before capture, as CUDA graphs require (real steps).
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._run(images, labels)
            torch.cuda.current_stream().wait_stream(side)
            return None
        if self.graph is None:
            if not isinstance(self.opt.param_groups[0]["lr"], torch.Tensor):
                raise RuntimeError("CUDA graph needs a tensor learning rate (set train.cuda_graph false)")
            self.static = (images.clone(), labels.clone())
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: other threads (DataLoader pin-memory, NCCL watchdog) may touch CUDA
            # while this one captures; in the default global mode that invalidates the capture.
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self._run(*self.static)
        self.static[0].copy_(images)
        self.static[1].copy_(labels)
        self.graph.replay()
        return None


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, flip: bool, batch: int = 2048) -> torch.Tensor:
    """Predicted classes (eval mode) for uint8 images on the model's device.

    With ``flip``, the logits of each image and its mirror image are averaged (test-time
    augmentation: the model was trained on flipped images too).
    """
    was_training = model.training
    model.eval()
    preds = []
    for x in images.split(batch):
        logits = model(x)
        if flip:
            logits = logits + model(x.flip(3))
        preds.append(logits.argmax(1))
    model.train(was_training)
    return torch.cat(preds)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, flip: bool) -> float:
    return (predict(model, images, flip) == labels).sum().item() / max(1, len(labels))


def sync(device: torch.device | None) -> None:
    """Wait for the device (CUDA) so that a clock read after it measures finished work."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak device memory on CUDA; peak resident memory of this process on CPU."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(cfg: Config, prec, strategy, num_classes: int, total_steps: int):
    """Model, wrapped model, fused SGD, one-cycle schedule and scaler for one variant."""
    t, device = cfg.train, strategy.device
    raw_model = build_model(cfg, num_classes, device)
    scaler, facts = precision.apply(prec, raw_model, device, t.amp_dtype)
    if t.dp_autocast_outside_forward:  # the tutorial's claim 4, demonstrated (model.py); never otherwise
        facts.update(autocast_outside(raw_model))
    model = strategy.wrap(raw_model)
    use_graph = t.cuda_graph and strategy.capturable()
    facts["cuda_graph_used"] = use_graph
    torch.backends.cudnn.benchmark = t.cudnn_benchmark
    opt = torch.optim.SGD(
        raw_model.parameters(),
        # A captured graph reads the learning rate from a device tensor the scheduler fills.
        lr=torch.tensor(t.lr, device=device) if use_graph else t.lr,
        momentum=t.momentum,
        nesterov=t.momentum > 0,
        weight_decay=t.weight_decay,
        fused=device.type == "cuda" or None,  # fused: GradScaler's checks stay on the device
    )
    if t.momentum > 0:
        # Fused SGD creates momentum buffers with empty_like on its first step and leaves them
        # uninitialised if GradScaler skips that step (inf gradients): start them at zero, which
        # is the same maths (buffer = gradient on the first real step).
        for p in raw_model.parameters():
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    if total_steps < 4:
        raise ValueError(
            f"only {total_steps} training steps (train.epochs x train set / train.batch_size): the "
            "one-cycle schedule needs at least 4; raise train.epochs or lower train.batch_size"
        )
    # OneCycleLR divides by the warm-up length in steps, which must exceed one step.
    pct = max(t.warmup_fraction, 1.5 / total_steps)
    if pct != t.warmup_fraction:
        log.warning("train.warmup_fraction %.3f is under 2 steps of %d; using %.3f", t.warmup_fraction,
                    total_steps, pct)  # fmt: skip
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, t.lr, total_steps=total_steps, pct_start=pct, cycle_momentum=False
    )
    return raw_model, model, opt, sched, scaler, facts, use_graph


def train_seed(job: Job, hooks=None, resume: dict | None = None, meta: dict | None = None) -> dict:
    """Train one seed; return the result summary. Raises Stopped after a requested stop."""
    cfg, t, strategy, hooks = job.cfg, job.cfg.train, job.strategy, hooks or NullHooks()
    device = strategy.device
    torch.manual_seed(job.seed)  # identical initial weights on every rank and variant
    batches = loader.make(t.loader, job.data, t.batch_size, strategy, job.seed, t.workers)
    parts = setup(cfg, job.precision, strategy, len(job.data["classes"]), t.epochs * len(batches))
    raw_model, model, opt, sched, scaler, facts, use_graph = parts
    probe = DtypeProbe(raw_model)  # what each (DataParallel) replica's first conv really produced
    cuda = device.type == "cuda"
    state = {"epoch": 0, "step": 0, "history": [], "stats": None, **(meta or {})}
    if resume:
        raw_model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        scaler.load_state_dict(resume["scaler"])
        state.update({k: resume[k] for k in ("epoch", "step", "history", "stats")})
        if use_graph:  # a captured graph reads the learning rate from a device tensor
            for group in opt.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=device)
        log.info("resuming seed %d at epoch %d step %d", job.seed, state["epoch"], state["step"])
    criterion = nn.CrossEntropyLoss(label_smoothing=t.label_smoothing)
    stats = torch.zeros(STATS_SIZE, dtype=torch.float64, device=device)
    step = Step(model, opt, scaler, criterion, stats, device, use_graph, strategy.graph_warmup_steps)
    test_x = job.data["test_images"].to(device)
    test_y = job.data["test_labels"].to(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    result = {"diverged": False, **facts, **strategy.facts()}

    def save(epoch: int, step_in_epoch: int, partial, elapsed: float = 0.0) -> None:
        if strategy.is_main:
            state.update(epoch=epoch, step=step_in_epoch, stats=partial, elapsed=elapsed)
            checkpoint.save(
                {
                    **state, "model": raw_model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                    "rng_cpu": torch.get_rng_state(), "seed": job.seed,
                    # metrics the tracking store has not taken yet: a re-run sends them
                    "hooks": hooks.state() if hasattr(hooks, "state") else None,
                },
                job.checkpoint_path,
            )  # fmt: skip

    last_save = time.perf_counter()
    if job.progress:
        job.progress.start_seed(job.seed, state["epoch"], state["step"])
    for epoch in range(state["epoch"], t.epochs):
        first = state["step"] if epoch == state["epoch"] else 0
        torch.manual_seed((job.seed * 100_003 + epoch) * 4099 + strategy.rank)  # dropout, per rank
        stats.zero_()
        stats[FIRST_BAD] = -1
        before = 0.0
        if first and state["stats"] is not None:
            stats.copy_(torch.as_tensor(state["stats"], dtype=torch.float64))
            before = state.get("elapsed", 0.0)
        model.train()
        sync(device)
        t0 = time.perf_counter()
        bar = tqdm(
            batches.epoch(epoch, first), total=len(batches), initial=first, leave=False,
            desc=f"seed {job.seed} epoch {epoch + 1}/{t.epochs}",
            disable=None if strategy.is_main else True,  # None: off when not a terminal
        )  # fmt: skip
        for i, (images, labels) in enumerate(bar, start=first):
            step(images, labels)
            sched.step()
            if job.progress:
                job.progress.step(device)
            # Every stop_check_every steps and at each epoch end (an epoch may be shorter than that).
            check = strategy.world_size == 1 or (i + 1) % t.stop_check_every == 0 or i + 1 == len(batches)
            if check and strategy.any(job.stop_requested()):
                sync(device)
                save(epoch, i + 1, stats.tolist(), before + time.perf_counter() - t0)
                raise Stopped(f"stopped at epoch {epoch + 1} step {i + 1}; checkpoint saved")
        sync(device)
        seconds = before + time.perf_counter() - t0  # before: a resumed epoch's earlier part
        s = strategy.all_sum(stats.clone())
        s[FIRST_BAD] = stats[FIRST_BAD]
        s[SKIPPED] = stats[SKIPPED]  # every rank's scaler sees the same all-reduced gradients
        loss_sum, correct, count, nonfinite, skipped, first_bad, _, finite = s.tolist()
        weights_ok = bool(torch.stack([p.isfinite().all() for p in raw_model.parameters()]).all())
        scale = float(precision.scale_tensor(scaler, device))
        metrics = {
            "train_loss": loss_sum / finite if finite else math.nan,  # finite-loss steps only
            "train_accuracy": correct / max(1, count),
            "epoch_seconds": seconds,
            "epoch_images_per_second": count / seconds,
            "lr": float(sched.get_last_lr()[0]),  # a device tensor when a CUDA graph is used
            "grad_scale": scale,
            "skipped_steps": skipped,
            "nonfinite_losses": nonfinite,
        }
        if t.eval_each_epoch or epoch == t.epochs - 1:
            metrics["test_accuracy"] = accuracy(raw_model, test_x, test_y, t.eval_flip)
        diverged = (
            not weights_ok
            or (nonfinite > 0 and not scaler.is_enabled())
            or (scaler.is_enabled() and scale < t.scale_floor)
        )
        state["history"].append({"epoch": epoch + 1, **metrics})
        if diverged:
            at = int(first_bad) if first_bad >= 0 else len(batches) - 1
            result.update(diverged=True, diverged_epoch=epoch + 1, diverged_step=at)
            log.warning("seed %d diverged at epoch %d step %d", job.seed, epoch + 1, at)
        # Record first, then checkpoint: a kill in between re-runs this epoch on resume and logs
        # the same values again, where the other order would lose this epoch's metrics.
        hooks.on_epoch(epoch + 1, metrics)
        # Checkpoints are not free (model + momentum: 190 MB, fsync'd): on a fast GPU an epoch
        # takes a fraction of a second, so save when checkpoint_every_s has passed.
        last = epoch + 1 == t.epochs or diverged  # train.py writes model.pt next
        if not last and time.perf_counter() - last_save >= t.checkpoint_every_s:
            save(epoch + 1, 0, None)
            last_save = time.perf_counter()
        if job.progress:
            job.progress.epoch_done(device)
        if diverged:
            break
    hist = state["history"]
    steady = hist[1:] or hist
    result.update(
        epochs_completed=len(hist),
        train_seconds=sum(h["epoch_seconds"] for h in hist),
        first_epoch_seconds=hist[0]["epoch_seconds"] if hist else math.nan,
        images_per_second=sum(h["epoch_images_per_second"] for h in steady) / max(1, len(steady)),
        peak_memory_mb=peak_memory_mb(device),
        final_train_accuracy=hist[-1]["train_accuracy"] if hist else math.nan,
        final_test_accuracy=hist[-1].get("test_accuracy", math.nan) if hist else math.nan,
        replica_dtypes=probe.fact() or "not recorded (no training step ran)",
    )
    return {"result": result, "history": hist, "state_dict": raw_model.state_dict()}
