"""The study measures the step, not its own bookkeeping: nothing of the tool's own runs inside a
timed epoch, and a seed starts from a clean slate whatever ran before it in the process."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import pytest

from ampbench import config
from ampbench.tracking.epoch_hooks import EpochHooks
from ampbench.training import loop, measure, parallel, precision
from conftest import make_dataset

# Code of the tool's own that must never run while an epoch's clock runs: tracking, NVML's energy,
# and any logging, MLflow, SQL or NVML call made by the tool (torch's own internals may consult
# a logger's level: not the tool's work).
OURS_FORBIDDEN = ("ampbench.tracking", "ampbench.training.energy")
CALLED_FORBIDDEN = ("logging", "mlflow", "sqlalchemy", "pynvml")


def _cfg(**train) -> config.Config:
    base = {"epochs": 3, "batch_size": 10, "lr": 0.05, "seeds": (0,), "workers": 0, "cuda_graph": False}
    model = {"fc_dim": 32, "batch_norm": False, "dropout": 0.0}
    return config.replace(config.Config(), model=model, train={**base, "checkpoint_every_s": 60.0, **train})


def _job(tmp_path, seed: int = 0) -> loop.Job:
    return loop.Job(
        _cfg(), precision.REGISTRY["fp32"], parallel.Single(), make_dataset(), seed, tmp_path / f"ck{seed}.pt"
    )


class SlowStore:
    """A tracking store whose every send holds the interpreter for 30 ms (an sqlite transaction's
    Python side), and says whether it ever ran inside a timed epoch."""

    uri = "test://slow"

    def __init__(self) -> None:
        self.sends, self.inside = 0, 0

    def log_metrics(self, run_id, metrics, step=None):
        self.inside += measure.TIMED.is_set()
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:  # busy: Python bytecode, the GIL held
            pass
        self.inside += measure.TIMED.is_set()
        self.sends += 1


def test_no_metrics_send_overlaps_a_timed_epoch(tmp_path):
    store = SlowStore()
    hooks = EpochHooks(store, "run", send_every_s=0.0)  # every epoch: the worst case
    result = loop.train_seed(_job(tmp_path), hooks)["result"]
    assert hooks.close()
    assert store.sends == 3, "every epoch's metrics reached the store"
    assert store.inside == 0, "a send ran while an epoch was timed"
    assert result.disturbed_epochs == 0


def test_a_timed_epoch_runs_no_tracking_logging_or_nvml_code(tmp_path):
    """A trace of every Python call while measure.TIMED is set, in every thread."""
    seen: list[tuple[str, str]] = []

    def tracer(frame, event, arg):
        if event == "call" and measure.TIMED.is_set():
            caller = frame.f_back.f_globals.get("__name__", "?") if frame.f_back else "?"
            seen.append((threading.current_thread().name, frame.f_globals.get("__name__", "?"), caller))

    threading.setprofile(tracer)
    sys.setprofile(tracer)
    hooks = EpochHooks(SlowStore(), "run", send_every_s=0.0)  # its sender is traced too
    try:
        loop.train_seed(_job(tmp_path), hooks)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    hooks.close()
    assert seen, "the trace saw the timed epochs"
    others = {t for t, _, _ in seen if t != threading.main_thread().name}
    assert not others, f"other threads ran Python code inside a timed epoch: {others}"
    bad = sorted(
        {
            f"{caller} -> {m}"
            for _, m, caller in seen
            if m.startswith(OURS_FORBIDDEN)
            or (m.startswith(CALLED_FORBIDDEN) and caller.startswith("ampbench"))
        }
    )
    assert not bad, f"the tool's own code ran inside a timed epoch: {bad}"
    assert {"ampbench.training.step", "ampbench.training.loader"} <= {m for _, m, _ in seen}


def test_a_slow_send_is_waited_for_at_most_the_hold_timeout_and_counted(tmp_path, monkeypatch):
    answer = threading.Event()

    class StuckStore(SlowStore):
        def log_metrics(self, run_id, metrics, step=None):
            # A remote server that does not answer until the seed is over: whatever the load on
            # the machine, the send outlasts the next epoch's hold (a fixed sleep raced the epochs).
            answer.wait(60)
            self.sends += 1

    monkeypatch.setattr(measure, "HOLD_TIMEOUT_S", 0.05)
    hooks = EpochHooks(StuckStore(), "run", send_every_s=0.0)
    try:
        result = loop.train_seed(_job(tmp_path), hooks)["result"]
    finally:
        answer.set()
    hooks.close()
    assert result.disturbed_epochs >= 1  # said, not hidden: the self-check reports it


def test_the_cyclic_collector_is_off_inside_and_restored_after():
    assert gc.isenabled()
    with measure.timed_region(loop.NullHooks()) as quiet:
        measure.EpochClock(None, measure_energy_none())
        assert quiet and not gc.isenabled() and measure.TIMED.is_set()
    assert gc.isenabled() and not measure.TIMED.is_set()  # cleared even without a read


def measure_energy_none():
    from ampbench.training import energy

    return energy.Energy(None)


def test_a_seed_leaves_nothing_alive_for_the_next(tmp_path, monkeypatch):
    """The CPU proxy of 'a seed's peak memory does not depend on the seeds before it': the first
    seed's model, optimizer and step are gone once the next seed starts."""
    alive: list[weakref.ref] = []
    real = loop.SeedTraining.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        alive.extend(weakref.ref(o) for o in (self, self.trainer.raw_model, self.trainer.opt, self.step))

    monkeypatch.setattr(loop.SeedTraining, "__init__", spy)
    out = loop.train_seed(_job(tmp_path, 0))
    del out
    first = list(alive)
    measure.clean_slate(None)  # what train_seed does before the next seed
    assert all(ref() is None for ref in first), [type(r()).__name__ for r in first if r() is not None]


def test_peak_memory_facts_on_cpu_are_the_process_peak():
    facts = measure.PeakMemory(__import__("torch").device("cpu")).facts()
    assert set(facts) == {"peak_memory_mb"} and facts["peak_memory_mb"] > 0


@pytest.mark.parametrize(("values", "cv"), [([100.0, 100.0, 100.0], 0.0), ([1.0], float("nan"))])
def test_spread_of_an_epoch_series(values, cv):
    got = measure.spread(values)
    assert (got != got and cv != cv) or got == pytest.approx(cv)


@pytest.mark.slow  # a sampler process importing MLflow
def test_the_system_metrics_sampler_is_sampling_before_training_starts(tmp_path):
    """Its start (imports, NVML, the store) must not overlap the first seed's timed epochs."""
    from ampbench.tracking.train_runs import SystemMetrics
    from conftest import empty_store, mlflow_client

    store = empty_store(tmp_path / "mlflow.db")
    client = mlflow_client(f"sqlite:///{store}")
    run = client.create_run(client.create_experiment("sampler"))
    t0 = time.perf_counter()
    sampler = SystemMetrics(run.info.run_id, f"sqlite:///{store}")
    started = time.perf_counter() - t0
    assert sampler.proc.poll() is None, "the sampler is running when the constructor returns"
    sampler.finish()
    assert sampler.proc.returncode == 0
    assert started > 0.2, f"returned after {started:.2f} s: it did not wait for the sampler's start"
