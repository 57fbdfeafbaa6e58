"""A model that cannot fit this machine's memory is refused before any run is created."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampbench.config import ConfigError, load_config
from ampbench.training import memory_check
from conftest import REPO, run_cli, runs


def _cfg(fc_dim: int):
    return load_config(REPO / "params.yaml", [f"model.fc_dim={fc_dim}"])


def test_a_model_larger_than_the_hosts_memory_is_refused_naming_the_setting():
    free = memory_check.available_bytes(torch.device("cpu"))
    assert free is not None and free > 0
    with pytest.raises(ConfigError) as err:  # 10 G parameters: 150 GiB, more than this machine has
        memory_check.check_fits(_cfg(100_000), torch.device("cpu"), 10)
    message = str(err.value)
    assert message.startswith("model.fc_dim: 100000 makes a model of 10,")
    assert "GiB free: choose a smaller model.fc_dim" in message


def test_the_hosts_memory_is_shared_by_its_processes(monkeypatch, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       4000 kB\nMemAvailable:   1000 kB\n")
    monkeypatch.setattr(memory_check, "MEMINFO", meminfo)
    assert memory_check.available_bytes(torch.device("cpu")) == 1000 * 1024
    assert memory_check.available_bytes(torch.device("cpu"), processes=4) == 1000 * 1024 // 4
    monkeypatch.setattr(memory_check, "MEMINFO", tmp_path / "missing")
    assert memory_check.available_bytes(torch.device("cpu")) is None


def test_the_study_model_fits():
    memory_check.check_fits(_cfg(4096), torch.device("cpu"), 10)


@pytest.mark.slow  # a train stage as a subprocess
def test_the_train_stage_refuses_before_creating_a_run(project: Path):
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32", "--set",
                   "model.fc_dim=100000", check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "makes a model of" in proc.stderr and "Traceback" not in proc.stderr
    assert runs(project) == []
