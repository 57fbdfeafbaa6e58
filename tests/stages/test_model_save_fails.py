"""A seed whose model.pt cannot be written (a full disk under checkpoints/) ends its MLflow run
FAILED, not RUNNING for good (final pass L: a 3 MiB tmpfs as checkpoints/: the one-line error was
right, but the seed run stayed RUNNING under a FAILED variant run, and no re-run closed it)."""

from __future__ import annotations

import errno
import os

import pytest

from ampbench import cli
from ampbench.checkpoints.state import ModelFile
from conftest import runs


@pytest.mark.slow  # trains the tiny project's variant in this process
def test_a_model_file_that_cannot_be_written_ends_the_seed_run_failed(project, monkeypatch, handlers):
    def full(self, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    monkeypatch.setattr(ModelFile, "save", full)
    assert cli.main(["train", "--parallel", "single", "--precision", "fp32"]) == cli.EXIT_ERROR
    assert [r.info.status for r in runs(project, kind="seed")] == ["FAILED"]
    assert [r.info.status for r in runs(project, kind="variant")] == ["FAILED"]
