"""The energy the GPUs of this process used, from NVML's total-energy counter (Volta and newer).

The counter holds millijoules since the driver loaded, per physical GPU, whatever ran on it: a
reading over a region is the whole GPU's energy in that time, idle power included, so figures are
fair only when nothing else runs on the GPU. Without a CUDA device, pynvml, the NVML library or the
counter (older or virtual GPUs), :meth:`Energy.joules` returns None and reports say 'n/a'.
"""

from __future__ import annotations

import functools
import logging
import math

import torch

log = logging.getLogger(__name__)


class Energy:
    """Joules used so far by the GPUs one process drives (summed), or None where unmeasurable."""

    def __init__(self, device: torch.device | None, count: int = 1) -> None:
        """`device`: the process's first GPU; `count`: how many it drives from there (DataParallel
        drives every visible GPU from one process; a DDP rank drives one)."""
        self.handles: list = []
        self.why_not = "not a CUDA device"
        if device is None or device.type != "cuda":
            return
        try:
            pynvml = _nvml()
            first = device.index or 0
            handles = [_handle(pynvml, i) for i in range(first, first + count)]
            for h in handles:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # raises where the GPU has no counter
            self.handles, self.nvml = handles, pynvml
        except Exception as err:  # no pynvml, no NVML or no counter: 'n/a', said once in the log
            self.why_not = f"NVML's energy counter unavailable ({type(err).__name__}: {err})"
            log.info("energy not measured: %s", self.why_not)

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def joules(self) -> float | None:
        """The counters' sum now, in joules (a reading: subtract two for a region), or None."""
        if not self.handles:
            return None
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1e3
        except Exception as err:  # a GPU lost, NVML gone: a measurement never stops training
            self.handles, self.why_not = [], f"NVML's energy counter failed ({type(err).__name__}: {err})"
            log.warning("energy no longer measured: %s", self.why_not)
            return None


@functools.cache
def _nvml():
    """pynvml, initialised once per process (each seed measures; NVML's start is not free)."""
    import pynvml  # type: ignore[import-untyped]

    pynvml.nvmlInit()
    return pynvml


def _handle(pynvml, cuda_index: int):
    """NVML's handle of a CUDA device. By UUID: NVML numbers every GPU of the machine, CUDA only
    the visible ones (CUDA_VISIBLE_DEVICES), so index i may name another GPU in each."""
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is not None:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def of_seed(history: list[dict]) -> dict:
    """The seed's training energy (J) and images per joule, over all its epochs (the warm-up one
    too: it is energy the training took); empty unless every epoch's energy was measured."""
    if not history or any(h.get("epoch_joules") is None for h in history):
        return {}
    joules = sum(h["epoch_joules"] for h in history)
    images = sum(h["epoch_images_per_second"] * h["epoch_seconds"] for h in history)
    return {"train_joules": joules, "images_per_joule": images / joules if joules > 0 else math.nan}
