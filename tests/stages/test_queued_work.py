"""Work in progress outlives DVC's temporary workspaces (`dvc exp run --queue`, `--temp`).

DVC runs a queued experiment in a copy of the repository under <repo>/.dvc/tmp/exps/<tmp>/ and
deletes the copy when the experiment ends, fails or is killed (`dvc queue kill`), checkpoints
included. The train stage keeps its work in the repository's checkpoints/queued/<digest>/ instead,
so queuing the same experiment again resumes it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampbench import paths
from conftest import clean_env, new_project


def test_a_temporary_workspace_keeps_its_work_in_the_repository(tmp_path):
    repo = tmp_path / "repo"
    copy = repo / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    assert paths.temp_workspace_root(copy) == repo.resolve()
    assert paths.work_root("0123abcd", copy) == repo.resolve() / "checkpoints" / "queued" / "0123abcd"
    assert paths.temp_workspace_root(copy / "sub") == repo.resolve()


def test_a_plain_workspace_keeps_checkpoints_where_they_were(tmp_path):
    assert paths.temp_workspace_root(tmp_path) is None
    assert paths.work_root("0123abcd", tmp_path) == Path("checkpoints")


@pytest.mark.slow  # a train stage as a subprocess, killed, its workspace deleted, run again
def test_a_killed_queued_experiment_queued_again_resumes(tmp_path):
    repo = tmp_path / "repo"
    workspace = repo / ".dvc" / "tmp" / "exps" / "tmp1"
    new_project(workspace, per_class=30, train={"epochs": 6, "checkpoint_every_s": 0})
    cmd = [sys.executable, "-m", "ampbench", "train", "--parallel", "single", "--precision", "fp32"]
    env = clean_env(CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(cmd, cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    queued = repo / "checkpoints" / "queued"
    deadline = time.monotonic() + 180
    while not list(queued.glob("*/single-fp32/seed-0/checkpoint.pt")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no checkpoint under {queued}: {proc.communicate()[0].decode()[-3000:]}")
        time.sleep(0.1)
    proc.kill()  # `dvc queue kill`, then DVC removes the temporary copy
    proc.wait()
    saved = tmp_path / "saved"
    shutil.copytree(workspace, saved)
    shutil.rmtree(workspace)
    shutil.copytree(saved, workspace)  # the experiment queued again: a fresh copy of the repository
    shutil.rmtree(workspace / "checkpoints", ignore_errors=True)
    again = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming seed 0" in again.stderr, again.stderr[-3000:]
    assert (workspace / "models" / "single-fp32" / "seed-0" / "model.pt").is_file()
    assert not list(queued.glob("*/single-fp32"))  # published, then the work folder removed
