"""Energy per seed (issue #24): NVML's counter read around exactly the training the clock times,
saves taken out, a resumed epoch's first part carried in its checkpoint, and nothing (never a
zero) where there is no counter. The counter itself needs a GPU: here a fake NVML and a fake
100 W counter stand in for it; the GPU run checks the real one (docs/BENCHMARKS.md)."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from ampbench import config
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.report import compare
from ampbench.tracking import evaluate_runs
from ampbench.training import energy, loop, parallel, precision
from conftest import make_dataset

WATTS = 100.0


class HundredWatts:
    """A GPU that draws 100 W all the time: its counter is 100 x the clock."""

    available = True

    def __init__(self, device, count: int = 1) -> None:
        pass

    def joules(self) -> float:
        return WATTS * time.perf_counter()


def _cfg(**train) -> config.Config:
    model = {"fc_dim": 32, "batch_norm": False, "dropout": 0.0}
    base = {"epochs": 2, "batch_size": 12, "lr": 0.05, "seeds": (0,), "workers": 0, "cuda_graph": False}
    return config.replace(config.Config(), model=model, train={**base, **train})


def _job(tmp_path, **train) -> loop.Job:
    cfg = _cfg(**train)
    return loop.Job(cfg, precision.REGISTRY["fp32"], parallel.Single(), make_dataset(), 0, tmp_path / "ck.pt")


def _assert_100_watts(history: list[dict]) -> None:
    for h in history:  # joules and seconds cover the same region: saves out of both
        assert h["epoch_joules"] == pytest.approx(WATTS * h["epoch_seconds"], rel=1e-3, abs=0.05), h


def test_a_seed_without_an_energy_counter_records_no_energy(tmp_path):
    meter = energy.Energy(torch.device("cpu"))
    assert meter.joules() is None and not meter.available
    out = loop.train_seed(_job(tmp_path, checkpoint_every_s=60.0))
    assert all("epoch_joules" not in h for h in out["history"]), out["history"]
    assert out["result"].train_joules is None and out["result"].images_per_joule is None


def test_seed_energy_covers_the_timed_training_and_not_its_saves(tmp_path, monkeypatch):
    monkeypatch.setattr(energy, "Energy", HundredWatts)
    # a save after every step: a joule counted during a save would break 100 W x epoch_seconds
    out = loop.train_seed(_job(tmp_path, checkpoint_every_s=1e-9))
    hist, result = out["history"], out["result"]
    assert result.checkpoints_written >= 4, result  # precondition: saves happened mid-epoch
    _assert_100_watts(hist)
    assert result.train_joules == pytest.approx(sum(h["epoch_joules"] for h in hist))
    images = sum(h["epoch_images_per_second"] * h["epoch_seconds"] for h in hist)
    assert result.images_per_joule == pytest.approx(images / result.train_joules)


def test_a_resumed_epoch_counts_the_energy_of_its_first_part(tmp_path, monkeypatch):
    monkeypatch.setattr(energy, "Energy", HundredWatts)
    job = _job(tmp_path, checkpoint_every_s=60.0, epochs=1)
    calls = iter(range(100))
    job.stop_requested = lambda: next(calls) == 2  # stop after the third step
    with pytest.raises(loop.Stopped):
        loop.train_seed(job)
    saved = SeedCheckpoint.load(job.checkpoint_path)
    assert saved.step == 3 and saved.joules == pytest.approx(WATTS * saved.elapsed, abs=0.05)
    time.sleep(0.2)  # between the runs: neither's time nor energy
    job.stop_requested = lambda: False
    out = loop.train_seed(job, resume=saved)
    assert out["history"][0]["epoch_seconds"] > saved.elapsed  # precondition: the first part counted
    _assert_100_watts(out["history"])


def test_nvml_counters_are_found_by_uuid_and_summed(monkeypatch):
    counters = {"GPU-u1": 5_000, "GPU-u2": 7_500}  # millijoules
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetHandleByIndex=lambda i: pytest.fail("CUDA index used as NVML index"),
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: counters[handle],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    energy._nvml.cache_clear()  # NVML is started once per process: this test's fake instead
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=f"u{i}"))
    meter = energy.Energy(torch.device("cuda", 1), count=2)  # DataParallel from cuda:1: cuda:1, cuda:2
    assert meter.joules() == pytest.approx(12.5)


def test_no_counter_on_the_gpu_means_none_with_the_reason(monkeypatch):
    def unsupported(handle):
        raise RuntimeError("Not Supported")

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetTotalEnergyConsumption=unsupported,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    energy._nvml.cache_clear()  # NVML is started once per process: this test's fake instead
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="u0"))
    meter = energy.Energy(torch.device("cuda", 0))
    assert meter.joules() is None and "Not Supported" in meter.why_not


def test_a_counter_that_fails_mid_training_stops_the_measure_not_the_training(monkeypatch):
    reads = iter([5_000])  # one good read, then NVML fails (a GPU lost)

    def read(handle):
        return next(reads)

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetTotalEnergyConsumption=read,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    energy._nvml.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="u0"))
    meter = energy.Energy(torch.device("cuda", 0))  # its probe read takes the good value
    assert meter.joules() is None and "failed" in meter.why_not and meter.joules() is None


def _seed(acc: float, joules: float | None) -> dict:
    per_joule = None if joules is None else 1e6 / joules
    return {
        "test_accuracy": acc,
        "train_seconds": 10.0,
        "images_per_second": 1e5,
        "peak_memory_mb": 900.0,
        "train_joules": joules,
        "images_per_joule": per_joule,
        "diverged": False,
        "devices_used": 1,
    }


def test_energy_in_the_variant_aggregates_and_the_comparison(tmp_path):
    measured = [_seed(0.80, 2000.0), _seed(0.81, 2200.0)]
    partly = [_seed(0.80, 2000.0), _seed(0.81, None)]  # one seed without: no mean of the other
    agg = evaluate_runs.aggregates(measured)
    assert agg["train_joules"] == pytest.approx(2100.0) and agg["train_joules_std"] > 0
    assert evaluate_runs.aggregates(partly)["train_joules"] is None
    rows = compare.summarize({"single-fp32": {"seeds": measured}, "single-autocast": {"seeds": partly}})
    table = compare.to_markdown(rows)
    assert "| 2.10 ± 0.14 | 477 ± 32 |" in table, table  # kJ, images/J
    assert table.count("| 900 ± 0 | n/a | n/a | 1 |") == 1, table  # the variant a seed lacks energy for
    compare.chart(rows, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


@pytest.fixture(autouse=True)
def _nvml_started_afresh():
    yield
    energy._nvml.cache_clear()  # no fake NVML left for the next test


def test_a_comparison_without_any_energy_says_so_once_instead_of_two_columns_of_na():
    rows = compare.summarize({"single-fp32": {"seeds": [_seed(0.80, None), _seed(0.81, None)]}})
    table = compare.to_markdown(rows)
    assert "energy kJ" not in table and "images/J" not in table
    assert "Energy: not measured here (no NVML energy counter" in table
    assert table.splitlines()[2].count("|") == table.splitlines()[3].count("|")  # header and rows agree
