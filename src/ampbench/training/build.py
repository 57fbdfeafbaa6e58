"""What one variant trains with: the model and optimizer (``Trainer``, ``setup``) and the step over
them (``make_step``). Imports no mlflow.

Precision and parallelism arrive as strategy objects (``precision.PrecisionStrategy``,
``parallel.ParallelStrategy``), so nothing here branches on a variant; the precision's per-run
state (``precision.PrecisionRun``: the GradScaler) is what the step scales and steps through. The
claim-4 demonstration (dp_autocast_outside.py) is wired in here only when its flag is set. The loop
over epochs is ``loop.train_seed``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from ampbench.config import Config, ConfigError
from ampbench.training import dp_autocast_outside, factory
from ampbench.training.compiler import Compiler
from ampbench.training.parallel import ParallelStrategy, Single
from ampbench.training.precision import PrecisionRun, PrecisionStrategy
from ampbench.training.step import Stats, Step

log = logging.getLogger(__name__)
_compiler_import: threading.Thread | None = None


def import_compiler_early() -> None:
    """Start importing torch._dynamo on a thread; :func:`setup` waits for it.

    torch.optim imports torch._dynamo when an optimizer is first used (its methods are wrapped to
    keep the compiler out), 2-3.7 s of imports in every train stage though nothing is compiled.
    Started once CUDA is up, the import runs while the main thread reads the data set and opens the
    MLflow store: what of that waits on the disk or SQLite frees the interpreter for the import
    (0.4-1.9 s off a train stage on the H200 host, 2026-12-04). The main thread imports nothing of
    torch meanwhile (setup joins the thread before it builds anything), so the two threads never
    import the same modules.
    """
    global _compiler_import
    if _compiler_import is None and "torch._dynamo" not in sys.modules:
        _compiler_import = threading.Thread(target=_import_dynamo, name="import torch._dynamo", daemon=True)
        _compiler_import.start()


def _import_dynamo() -> None:
    # A failure is left to torch.optim's own import, which raises it where it is seen.
    with contextlib.suppress(BaseException):
        import torch._dynamo  # noqa: F401


@dataclass
class Trainer:
    """What one variant trains with: the model (raw and wrapped), optimizer, schedule, precision."""

    raw_model: nn.Module  # what the strategy shards or replicates: its state only through `strategy`
    model: nn.Module  # wrapped by the precision, then the parallel strategy: what the step calls
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    precision: PrecisionRun  # the run's loss scaling (GradScaler), enabled or not
    facts: dict  # what is really in use (autocast dtype, scaler, CUDA graph), for logging
    use_graph: bool
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    compiler: Compiler = field(default_factory=lambda: Compiler("none"))
    strategy: ParallelStrategy = field(default_factory=Single)  # owns the model's and optimizer's state

    def state(self) -> dict:
        """What a checkpoint holds of the trainer (the loop adds its own position and history).
        Every rank calls it: a sharded strategy gathers the full state (a collective)."""
        return {
            **self.strategy.state_dict(self.raw_model, self.opt),  # model, optimizer
            "scheduler": self.sched.state_dict(),
            "scaler": self.precision.state_dict(),  # the key older checkpoints hold
        }

    def weights(self) -> dict:
        """The model's full state_dict (every rank calls it; what model.pt holds)."""
        return self.strategy.state_dict(self.raw_model)["model"]

    def load(self, saved: dict) -> None:
        """Restore what ``state`` returned (every rank: a sharded strategy scatters it)."""
        self.strategy.load_state_dict(self.raw_model, saved, self.opt)
        _check_optimizer_state(self.opt)
        self.sched.load_state_dict(saved["scheduler"])
        self.precision.load_state_dict(saved["scaler"])
        if self.use_graph:  # a captured graph reads the learning rate from a device tensor
            for group in self.opt.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)


def _check_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """RuntimeError where a restored per-parameter buffer (momentum) has another shape than its
    parameter: torch's load_state_dict checks only the number of parameters, and the first step
    would fail deep inside the optimizer."""
    for param, state in opt.state.items():
        for name, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                raise RuntimeError(
                    f"size mismatch for the optimizer's {name}: {tuple(value.shape)} in the "
                    f"checkpoint, {tuple(param.shape)} for its parameter in this model"
                )


def build_model(cfg: Config, num_classes: int, device: torch.device, stats=None) -> nn.Module:
    """The configured model (``model.name``, through the one factory) on `device`, channels_last
    on CUDA if configured. `stats`: the train split's per-channel (mean, std), factory.channel_stats."""
    model = factory.build(cfg.model, num_classes, cfg.data.image_size, stats).to(device)
    if device.type == "cuda" and cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def setup(
    cfg: Config,
    prec: PrecisionStrategy,
    strategy: ParallelStrategy,
    num_classes: int,
    total_steps: int,
    stats=None,
) -> Trainer:
    """Model, wrapped model, fused SGD, one-cycle schedule and precision state for one variant.
    The wrappers, inside out: the precision's forward context (autocast: each DataParallel replica
    enters it itself), the compiler's (autocast inside the compiled graph), the strategy's."""
    t, device = cfg.train, strategy.device
    if _compiler_import is not None:
        _compiler_import.join()
    if total_steps < 4:
        raise ConfigError(
            f"only {total_steps} training steps (train.epochs x train set / train.batch_size): the "
            "one-cycle schedule needs at least 4; raise train.epochs or lower train.batch_size"
        )
    raw_model = build_model(cfg, num_classes, device, stats)
    run = prec.setup(raw_model, device)
    facts = dict(run.facts)
    compiler = _compiler(t.compile, strategy)
    if t.dp_autocast_outside_forward:  # the tutorial's claim 4, demonstrated; never otherwise
        model, placement = dp_autocast_outside.autocast_outside(run, strategy.wrap(compiler.wrap(raw_model)))
        facts.update(placement)
    else:
        model = strategy.wrap(compiler.wrap(run.wrap(raw_model)))
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
    # OneCycleLR divides by the warm-up length in steps, which must exceed one step.
    pct = max(t.warmup_fraction, 1.5 / total_steps)
    if pct != t.warmup_fraction:  # only on tiny runs (the demo, tests): nothing to act on
        log.debug(
            "train.warmup_fraction %.3f is under 2 steps of %d; using %.3f",
            t.warmup_fraction,
            total_steps,
            pct,
        )
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, t.lr, total_steps=total_steps, pct_start=pct, cycle_momentum=False
    )
    return Trainer(raw_model, model, opt, sched, run, facts, use_graph, device, compiler, strategy)


def _compiler(mode: str, strategy: ParallelStrategy) -> Compiler:
    if mode != "none" and not strategy.compilable():
        log.warning(
            "train.compile=%s: not for %s over several GPUs (replicas in threads); eager", mode, strategy.name
        )
        return Compiler("none")
    return Compiler(mode)


def make_step(trainer: Trainer, cfg: Config, strategy: ParallelStrategy) -> Step:
    """The training step over `trainer`, with its own statistics (also what bench times)."""
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing)
    return Step(trainer, criterion, Stats(trainer.device), strategy.graph_warmup_steps)
