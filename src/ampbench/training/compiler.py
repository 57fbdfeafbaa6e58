"""``train.compile``: the model compiled by torch.compile (inductor), inside the captured step.

The step stays the one in step.py: its eager warm-up steps run the compiled model first (that is
when inductor compiles forward and backward, on a side stream), then the whole step, compiled
kernels included, is captured in the CUDA graph and replayed. So inductor's own CUDA graphs are
off (modes without ``reduce-overhead``): the step's graph already holds everything.

- ``default``: inductor's fused kernels (BatchNorm + ReLU, pooling, elementwise work).
- ``max-autotune-no-cudagraphs``: also times Triton templates for the matmuls and convolutions
  (minutes of compile the first time).

Compile time is measured apart (``compile_seconds``: the first step, synchronised, which compiles
forward and backward), never inside images/s (epoch 1 is out of the steady-state mean anyway).
``recompiles`` counts graphs compiled after that first step; none is expected (static shapes,
one batch size). Inductor's cache (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_<user>)
serves the later seeds and stages; it is outside the project, never in git or a DVC output.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import cast

import torch
from torch import nn

from ampbench.config import COMPILE_MODES

log = logging.getLogger(__name__)

MODES = COMPILE_MODES  # none, default, max-autotune-no-cudagraphs


class Compiler:
    """Compiles a model for one seed's step and counts what inductor compiled, and when."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"train.compile: {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.graphs = 0  # dynamo graphs handed to inductor
        self.graphs_after_first_step: int | None = None  # set once the first step ran
        self.first_step_seconds = 0.0

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model compiled (fullgraph: a graph break would be a silent slow path), or as is."""
        if not self.enabled:
            return model
        # Each seed (and each bench measure) compiles a new model: dynamo's cache of the earlier
        # ones (their modules gone) is dropped, so they never count toward its recompile limit (8
        # per code object). Inductor's on-disk cache still serves the same graph at once.
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=self._inductor, fullgraph=True, dynamic=False)
        return cast(nn.Module, compiled)  # an OptimizedModule: a Module with the same parameters

    def _inductor(self, graph, example_inputs):
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        if self.graphs_after_first_step is not None:
            log.warning("train.compile: recompiling after the first step (graph %d)", self.graphs)
        options = list_mode_options(self.mode) if self.mode != "default" else {}
        with warnings.catch_warnings():  # fp32 here means true fp32: TF32 stays off on purpose
            warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)
            return compile_fx(graph, example_inputs, config_patches=options)

    def first_step(self, run, device: torch.device) -> None:
        """Run the first step (which compiles) and time it, synchronised."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.first_step_seconds = time.perf_counter() - t0
        self.graphs_after_first_step = self.graphs

    def facts(self) -> dict:
        """For the seed's result: the mode, compile seconds and recompiles (0 when none)."""
        recompiles = self.graphs - (self.graphs_after_first_step or self.graphs)
        out: dict = {"compile": self.mode, "recompiles": recompiles}
        if self.enabled:
            out["compile_seconds"] = self.first_step_seconds
        return out
