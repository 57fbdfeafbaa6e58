"""A model that cannot fit this machine's memory is refused before any run is created."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ampbench.config import ConfigError, load_config
from ampbench.config.rules import alexnet_parameters
from ampbench.training import memory_check
from conftest import REPO, clean_env, new_project, run_cli, runs


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


@pytest.mark.slow  # each command as a subprocess
@pytest.mark.parametrize("command", ["estimate", "bench", "explain"])
def test_the_measuring_commands_refuse_before_building_the_model(project: Path, command: str):
    """The hostile re-run: `ampbench estimate --set model.fc_dim=100000` (so `make run`'s first
    step), bench and explain ended in a 27-37 line allocator traceback."""
    proc = run_cli(project, command, "--set", "model.fc_dim=100000", check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "model.fc_dim: 100000 makes a model of" in lines[0], lines[0]


def test_the_hostile_passes_oom_case_is_refused(monkeypatch):
    """fc_dim 25000 on DDP's 2 processes sharing 24 GiB: the old count (16 bytes a parameter,
    9.7 GiB) let it through and the kernel killed a worker; the measured rule refuses it."""
    monkeypatch.setattr(memory_check, "available_bytes", lambda device, processes=1: 24 * 2**30 // processes)
    with pytest.raises(ConfigError, match=r"needs at least 20\.5 GiB a process .* 12\.0 GiB free"):
        memory_check.check_fits(_cfg(25_000), torch.device("cpu"), 10, processes=2)
    memory_check.check_fits(_cfg(25_000), torch.device("cpu"), 10, processes=1)  # one process fits


@pytest.mark.slow  # a DDP train stage of a 75 M parameter model: about 40 s on 2 cores
def test_a_ddp_stage_stays_within_the_memory_it_is_checked_against(tmp_path: Path):
    """The rule is a measurement: each DDP worker's peak resident memory, training and exporting a
    75 M parameter model, stays under what the check counts (and over what the old rule counted,
    so the test would catch a rule that drifted back below reality)."""
    project = new_project(tmp_path / "p", model={"fc_dim": 8000}, tracking={"log_model": "export"},
                          train={"checkpoint_every_s": 1})  # fmt: skip
    # A fresh Python runs the stage and reports its children's peak: the largest descendant's
    # (a DDP worker's), untouched by whatever this test process ran before.
    measure = (
        "import resource, subprocess, sys\n"
        "cmd = [sys.executable, '-m', 'ampbench', 'train', '--parallel', 'ddp', '--precision', 'fp32']\n"
        "status = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode\n"
        "print(status, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    proc = subprocess.run([sys.executable, "-c", measure], cwd=project, env=clean_env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    status, peak_kib = map(int, proc.stdout.split())
    assert status == 0, proc.stderr
    peak = peak_kib * 1024
    params = alexnet_parameters(8000, True, 10)
    assert params * 16 < peak <= memory_check.needed_bytes(params), (peak, params)


def test_a_gpu_process_counts_what_cuda_itself_takes(monkeypatch):
    """Measured on an H100 (memory_check's docstring): about 4 GB of a GPU a process whatever the
    model (context, data on the device, workspaces), so 75 M parameters need 6.2 GiB there, not
    the host's 3.2; a GPU with 5 GiB free refuses what a host with 5 GiB free takes."""
    params = alexnet_parameters(8000, True, 10)
    assert memory_check.needed_bytes(params, "cuda") == params * 32 + 4 * 2**30
    monkeypatch.setattr(memory_check, "available_bytes", lambda device, processes=1: 5 * 2**30)
    memory_check.check_fits(_cfg(8000), torch.device("cpu"), 10)
    said = r"needs at least 6\.2 GiB a process \(32 bytes a parameter plus 4 GiB"
    with pytest.raises(ConfigError, match=said):
        memory_check.check_fits(_cfg(8000), torch.device("cuda", 0), 10)


def test_a_batch_whose_activations_cannot_fit_is_refused_naming_the_batch(monkeypatch):
    """Hostile pass: `ampbench estimate --set train.batch_size=1000000` grew to 20 GB and the
    kernel killed it; a batch of tens of thousands is now one line before any step."""
    monkeypatch.setattr(memory_check, "available_bytes", lambda device, processes=1: 8 * 2**30 // processes)
    cfg = load_config(REPO / "params.yaml", ["train.batch_size=40000"])
    with pytest.raises(ConfigError, match=r"^train\.batch_size: 40000 images a step need about 22\.4 GiB"):
        memory_check.check_fits(cfg, torch.device("cpu"), 10)
    memory_check.check_fits(_cfg(4096), torch.device("cpu"), 10)  # the study's batch of 512 fits


def test_the_estimate_refuses_a_batch_larger_than_the_train_set_before_timing_a_step():
    from ampbench.training import study_cost

    cfg = load_config(REPO / "params.yaml", ["train.batch_size=100"])
    larger = r"train\.batch_size=100 is larger than the train set \(60 images\)"
    with pytest.raises(ConfigError, match=larger):
        study_cost.preflight(cfg, REPO / "params.yaml", force=True, sizes=(60, 20))


def test_a_containers_memory_limit_is_what_is_free(monkeypatch, tmp_path):
    """MemAvailable counts the host's memory; a container's cgroup limit is what its processes get."""
    monkeypatch.setattr(memory_check, "CGROUP", tmp_path)
    assert memory_check.cgroup_free() is None  # no cgroup files: no limit
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert memory_check.cgroup_free() is None
    (tmp_path / "memory.max").write_text(f"{4 * 2**30}\n")
    (tmp_path / "memory.current").write_text(f"{2**30}\n")
    assert memory_check.cgroup_free() == 3 * 2**30
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable:   {64 * 2**20} kB\n")  # 64 GiB on the host
    monkeypatch.setattr(memory_check, "MEMINFO", meminfo)
    assert memory_check.available_bytes(torch.device("cpu"), processes=3) == 2**30
    with pytest.raises(ConfigError, match=r"this container's memory limit \(cgroup\) leaves 3\.0 GiB free"):
        memory_check.check_fits(_cfg(8000), torch.device("cpu"), 10)


def test_an_address_space_limit_refuses_in_one_line_before_any_allocation(tmp_path):
    """Hostile re-run: under `ulimit -v 4000000` a model the host could hold passed the check,
    then failed in the allocator with a 52-line traceback, its runs left FAILED."""
    check = (
        "import resource, torch;"
        "resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, resource.RLIM_INFINITY));"
        "from ampbench.config import load_config;"
        "from ampbench.training import memory_check;"
        f"cfg = load_config({str(REPO / 'params.yaml')!r}, ['model.fc_dim=20000']);"
        "memory_check.check_fits(cfg, torch.device('cpu'), 10)"
    )
    proc = subprocess.run([sys.executable, "-c", check], env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "ConfigError: model.fc_dim 20000 and train.batch_size 512 need about 13.64 GiB more memory" in last
    assert "address-space limit (ulimit -v) leaves" in last and "MemoryError" not in proc.stderr


def test_bench_keeps_more_address_space_for_its_loader_workers(monkeypatch):
    """Final re-check: bench under `ulimit -v 4500000` (0.8 GiB left) printed "can't start new
    thread" tracebacks from its DataLoader rung and exited 0; train ran there."""
    monkeypatch.setattr(memory_check, "address_space_left", lambda: 2**30)
    cfg = load_config(REPO / "params.yaml", ["model.fc_dim=32", "train.batch_size=20"])
    memory_check.check_address_space(cfg)  # a train stage: 0.75 GiB kept, fits
    with pytest.raises(
        ConfigError, match=r"with 1\.00 GiB for what torch loads as it goes\), but .* leaves 1\.00 GiB"
    ):
        memory_check.check_address_space(cfg, margin=memory_check.BENCH_ADDRESS_MARGIN)
