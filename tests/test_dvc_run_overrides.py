"""`make run DATA=<path>` hands DVC `-S data.url=<path>` (python -m ampbench.dvc_run): DVC reads
-S values in its override grammar (Hydra's), where a quote in the path was a lexer error and a
comma a list of experiments. The path arrives in params.yaml as it was typed (issue 36)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from ampbench.dvc_guard import quoted_overrides

PATHS = ["/data/it's.tar.gz", "/my data/c,d [x] {y} (z)=:.tar.gz", "C:\\x\\y'.tgz", "/ends\\", "/${not}"]


@pytest.mark.parametrize("path", PATHS)
def test_a_data_url_is_read_back_as_the_same_string(path):
    argv = quoted_overrides(["exp", "run", "-S", f"data.url={path}", "-S", "train.seeds=[0,1]"])
    parse = OverridesParser.create().parse_overrides
    assert parse([argv[3]])[0].value() == path
    assert argv[5] == "train.seeds=[0,1]"  # other keys keep the grammar: a list stays a list


def test_only_set_params_are_quoted():
    assert quoted_overrides(["repro", "data.url=/x'y"]) == ["repro", "data.url=/x'y"]


@pytest.mark.slow
def test_dvc_exp_run_writes_a_path_with_a_quote_and_a_comma_into_params(tmp_path: Path):
    path = str(tmp_path / "it's, a [b].tar.gz")
    (tmp_path / "params.yaml").write_text("data:\n  url: old\n")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  show:\n    cmd: echo ok > out.txt\n    params: [data.url]\n    outs: [out.txt]\n"
    )
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (
        git + ["init", "-q"],
        [sys.executable, "-m", "dvc", "init", "-q"],
        git + ["add", "-A"],
        git + ["commit", "-qm", "p"],
    ):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    env = {**os.environ, "AMPBENCH_WARM": "0", "DVC_NO_ANALYTICS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.dvc_run", "exp", "run", "-S", f"data.url={path}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["data"]["url"] == path
