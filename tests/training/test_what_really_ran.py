"""Nothing runs as something it is not: DataParallel without GPUs, autocast where it is not
available and a GradScaler PyTorch disabled are recorded as what really ran, with a warning.
"""

from __future__ import annotations

import pytest
import torch

from ampbench.training import precision
from conftest import run_cli, runs


@pytest.mark.slow
def test_dp_without_gpus_records_one_device_and_warns(project):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ GPUs: DataParallel really splits the batch here")
    proc = run_cli(project, "train", "--parallel", "dp", "--precision", "fp32")
    assert "effectively single-device" in proc.stderr
    (run,) = runs(project, kind="seed")
    params = run.data.params
    assert params["devices_used"] == "1" and params["world_size"] == "1"
    assert params["grad_scaler_used"] == "False" and params["autocast_used"] == "False"


def test_dp_on_one_device_warns_once_a_stage_not_once_a_seed(caplog):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ GPUs: DataParallel really splits the batch here")
    from ampbench.training import parallel

    strategy = parallel.DataParallel()
    for _ in range(3):  # a stage wraps each seed's model
        strategy.wrap(torch.nn.Linear(2, 2))
    assert caplog.text.count("effectively single-device") == 1


def test_autocast_unavailable_is_reported_as_not_used(monkeypatch, caplog):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    model = torch.nn.Linear(2, 2)
    run = precision.REGISTRY["autocast"].setup(model, torch.device("cpu"))
    assert run.facts["autocast_used"] is False and run.facts["amp_dtype"] == "float32"
    assert run.wrap(model) is model  # no autocast wrapper where autocast cannot run
    assert "autocast is not available" in caplog.text


def test_gradscaler_disabled_by_pytorch_is_reported_as_not_used(caplog):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: GradScaler('cuda') is really enabled here")
    prec = precision.REGISTRY["autocast_gradscaler"]
    run = prec.setup(torch.nn.Linear(2, 2), torch.device("cuda"))
    assert run.facts["grad_scaler_used"] is False
    assert "GradScaler requested but disabled" in caplog.text
