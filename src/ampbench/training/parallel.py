"""The three parallel strategies: ``single``, ``dp`` (DataParallel) and ``ddp`` (DDP).

Each strategy sets up its processes, picks the device, wraps the model and derives the
per-process batch from the global batch (the invariant across variants). When a strategy
cannot use the devices it needs (DP without two GPUs, DDP on CPU processes) it still runs, warns,
and reports the devices it really used, so no speed-up is claimed that did not happen.

DDP processes are started by torchrun; see ``ampbench.stages.launch``. Adding one (FSDP, say) is a new
class with the ``ParallelStrategy`` interface plus its entry in ``STRATEGIES``: the CLI, the
config checks, DVC's matrix, bench and the loop take it from there and never test names.

The strategy owns the state-dict boundary: the loop's checkpoints, its resume, the final weights
in ``model.pt`` and its evaluation go through ``state_dict``, ``load_state_dict`` and ``unwrap``,
never the module's own ``state_dict``. Every rank calls them (a sharded strategy gathers the
full state there, a collective); rank 0 alone writes what they return. The three here hold a
full copy on every rank, so theirs are plain; FSDP's would gather and scatter
(``torch.distributed.checkpoint.state_dict``: full_state_dict, cpu_offload).
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from ampbench.training import step

log = logging.getLogger(__name__)


class ParallelStrategy(Protocol):
    """What the training loop, bench, the estimates and the CLI ask of a parallel strategy."""

    name: str
    in_process: bool  # False: a launcher (torchrun) starts the processes (see launch.py)
    rank: int
    local_rank: int
    world_size: int
    graph_warmup_steps: int  # eager steps before a CUDA graph may be captured
    device: torch.device  # valid after setup()

    def __init__(self, collective_timeout_s: float = 300.0) -> None: ...  # STRATEGIES[name](...)

    @property
    def is_main(self) -> bool: ...  # the one process that logs, checkpoints and publishes
    def setup(self) -> torch.device: ...  # processes, process group, device
    def wrap(self, model: nn.Module) -> nn.Module: ...  # what the training step calls
    def unwrap(self, model: nn.Module) -> nn.Module: ...  # `model` callable outside the step
    def state_dict(self, model: nn.Module, optimizer=None) -> dict: ...  # full state, every rank
    def load_state_dict(self, model: nn.Module, state: dict, optimizer=None) -> None: ...  # every rank
    def capturable(self) -> bool: ...  # can the wrapped step be captured in a CUDA graph
    def compilable(self) -> bool: ...  # can the model be compiled (train.compile)
    def per_process_batch(self, global_batch: int) -> int: ...  # raises ValueError if it cannot
    def devices_used(self) -> int: ...
    def any(self, flag: bool) -> bool: ...  # collective OR (every process calls it)
    def all_sum(self, t: torch.Tensor) -> torch.Tensor: ...  # collective sum, in place
    def barrier(self) -> None: ...
    def teardown(self) -> None: ...
    def facts(self) -> dict[str, object]: ...  # world_size, devices_used, device_type, device_name


class Single:
    """One process, one device."""

    name = "single"
    # Whether it runs inside the calling process; False: a launcher (torchrun) starts its processes.
    in_process = True
    rank = 0
    local_rank = 0
    world_size = 1
    # Eager steps before a CUDA graph is captured (cuDNN/cuBLAS set-up, lazy optimizer state).
    graph_warmup_steps = 3

    def __init__(self, collective_timeout_s: float = 300.0) -> None:
        self.timeout = datetime.timedelta(seconds=collective_timeout_s)
        self.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self) -> torch.device:
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        return self.device

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        """`model` (what ``wrap`` was given, or a module inside it; or what ``wrap`` returned) as
        it runs outside the training step on every rank: evaluation. Here the module itself."""
        return _inner(model)

    def state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """The full state of `model` (what ``wrap`` was given, or a module inside it) and of
        `optimizer`: {"model", "optimizer"}. Every rank calls it; rank 0 writes it."""
        state = {"model": _inner(model).state_dict()}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        return state

    def load_state_dict(
        self, model: nn.Module, state: dict, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Load what ``state_dict`` returned (full tensors) into `model` and `optimizer`, every rank."""
        _inner(model).load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])

    def capturable(self) -> bool:
        """Whether the wrapped training step can be captured in a CUDA graph."""
        return self.device.type == "cuda"

    def compilable(self) -> bool:
        return True

    def per_process_batch(self, global_batch: int) -> int:
        return global_batch

    def devices_used(self) -> int:
        return 1

    def any(self, flag: bool) -> bool:
        """True if any process says True (all processes must call it together)."""
        return flag

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over processes (in place); identity for one process."""
        return t

    def barrier(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def facts(self) -> dict[str, object]:
        cuda = self.device.type == "cuda"
        return {
            "world_size": self.world_size,
            "devices_used": self.devices_used(),
            "device_type": self.device.type,
            "device_name": torch.cuda.get_device_name(self.device) if cuda else _cpu_name(),
        }


class DataParallel(Single):
    """nn.DataParallel over every visible GPU; it splits the global batch itself."""

    name = "dp"
    _said_single = False  # the one-device warning: once a stage, not once a seed (9 lines a study)

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.devices_used() < 2 and not self._said_single:
            self._said_single = True
            log.warning(
                "dp: %d GPU(s) visible; DataParallel needs 2+ to split work, so this run is "
                "effectively single-device (recorded as devices_used=%d)",
                torch.cuda.device_count(),
                self.devices_used(),
            )
        return nn.DataParallel(model) if self.device.type == "cuda" else model

    def capturable(self) -> bool:
        # On one GPU DataParallel calls the module directly; on several it replicates the model
        # and runs the replicas in threads at every forward, which a CUDA graph cannot capture.
        return self.device.type == "cuda" and self.devices_used() == 1

    def compilable(self) -> bool:
        # Replicas of a compiled module, run in threads at every forward: not supported; on one
        # GPU (or a CPU) DataParallel calls the module itself.
        return self.devices_used() == 1

    def devices_used(self) -> int:
        return max(1, torch.cuda.device_count()) if self.device.type == "cuda" else 1


class Distributed(Single):
    """DistributedDataParallel, one process per device, started by torchrun."""

    name = "ddp"
    in_process = False
    # PyTorch's CUDA-graph notes: DDP needs at least 11 eager iterations before capture (its
    # reducer rebuilds buckets and settles its state during the first ones).
    graph_warmup_steps = 11

    def __init__(self, collective_timeout_s: float = 300.0) -> None:
        super().__init__(collective_timeout_s)
        if "RANK" not in os.environ:
            raise RuntimeError("ddp needs torchrun's environment; start it via `ampbench train`")
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])

    def setup(self) -> torch.device:
        cuda = torch.cuda.is_available()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        if cuda and local_world > torch.cuda.device_count():
            raise RuntimeError(
                f"ddp: {local_world} processes on this node but only {torch.cuda.device_count()} "
                "GPU(s); start at most one process per GPU (torchrun --nproc-per-node)"
            )
        if cuda:
            super().setup()
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend, timeout=self.timeout, device_id=self.device if cuda else None)
        if not cuda and self.is_main:
            log.warning(
                "ddp: no GPU; %d CPU processes on gloo share this machine's cores, so this "
                "measures correctness, not a speed-up",
                self.world_size,
            )
        return self.device

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.device.type != "cuda":
            return nn.parallel.DistributedDataParallel(model)
        # Built on the stream the step warms up and is captured on (CUDA-graph capture of DDP
        # needs a side stream): DDP keeps each parameter's gradient accumulator alive, tied to the
        # stream it was made on; any other stream made torch warn of a stream mismatch in every
        # DDP stage and join the streams in each backward.
        side = step.side_stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[self.local_rank])
        torch.cuda.current_stream().wait_stream(side)
        return ddp

    # capturable: inherited. NCCL collectives (the gradient all-reduce, the buffer broadcast)
    # can be captured in CUDA graphs; gloo on CPU has no graphs.

    def per_process_batch(self, global_batch: int) -> int:
        if global_batch % self.world_size:
            raise ValueError(
                f"train.batch_size={global_batch} does not divide by the DDP world size "
                f"{self.world_size}; choose a multiple of {self.world_size}"
            )
        return global_batch // self.world_size

    def devices_used(self) -> int:
        return self.world_size

    def any(self, flag: bool) -> bool:
        if self.world_size == 1:  # no collective, no host sync per step
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _inner(model: nn.Module) -> nn.Module:
    """The module inside a DataParallel or DDP wrapper; any other module as it is."""
    return model.module if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel) else model


STRATEGIES: dict[str, type[ParallelStrategy]] = {s.name: s for s in (Single, DataParallel, Distributed)}


def agree(strategy: ParallelStrategy, *flags: bool) -> list[bool]:
    """Each flag, true if any rank's is: one collective for all of them (every rank calls it)."""
    if strategy.world_size == 1:
        return list(flags)
    t = strategy.all_sum(torch.tensor([float(f) for f in flags], device=strategy.device))
    return [bool(v) for v in t.tolist()]


def make(name: str, collective_timeout_s: float = 300.0) -> ParallelStrategy:
    return STRATEGIES[name](collective_timeout_s)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu ({os.cpu_count()} cores)"
