"""`make run` (python -m ampbench.dvc_run) reads params.yaml strictly before DVC parses it: an
alias bomb or a repeated key is one line and exit 2 within seconds, not DVC's expansion into
gigabytes and a crash, nor ruamel's dozen lines (issue 36, F6 and W7)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

MEMORY_CAP = 2 * 2**30  # address space: python with DVC imported fits; an expanded bomb does not
# a few lines that expand to 10**9 values (the billion laughs), after a real section
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + chr(ord(c) - 1)] * 10)}]\n" for c in "bcdefghi"
)
STAGE = "stages:\n  show:\n    cmd: echo trained\n    params:\n      - train.lr\n"


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _repro(folder: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "AMPBENCH_WARM": "0", "DVC_NO_ANALYTICS": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ampbench.dvc_run", "repro"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_capped,
    )
    return done, time.monotonic() - started


@pytest.fixture
def project(tmp_path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, timeout=120
    )
    (tmp_path / "dvc.yaml").write_text(STAGE)
    return tmp_path


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ("train:\n  lr: 0.1\n" + BOMB, "line 3: YAML anchor or alias &a is not allowed"),
        ("train:\n  lr: 0.1\ntrain:\n  lr: 0.2\n", "line 3: key 'train' appears twice"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "line 1: values nested more than 20 levels"),
    ],
    ids=["alias-bomb", "duplicate-keys", "nested-5000-deep"],
)
def test_a_faulty_params_file_is_one_line_before_dvc_reads_it(project, params, said):
    (project / "params.yaml").write_text(params)
    done, took = _repro(project)
    lines = done.stderr.strip().splitlines() + done.stdout.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said in lines[0] and "params.yaml" in lines[0], lines[0]
    assert took < 10, f"{took:.1f} s"


def test_a_sound_params_file_is_handed_to_dvc(project):
    (project / "params.yaml").write_text("train:\n  lr: 0.1\n")
    done, _ = _repro(project)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained" in done.stdout, done.stdout


def test_a_second_pipeline_command_is_refused_before_it_touches_params(project):
    """`make run` while another runs in the project: DVC's `exp run -S` would rewrite params.yaml
    under the running study before finding its outputs locked. Refused first, naming the one
    running; params.yaml as it was."""
    (project / "params.yaml").write_text("train:\n  lr: 0.1\n")
    running = subprocess.Popen(["sleep", "60"])
    try:
        lock = {
            "write": {"models/single-fp32": {"pid": running.pid, "cmd": "dvc exp run -S x=1"}},
            "read": {},
        }
        (project / ".dvc" / "tmp").mkdir(exist_ok=True)
        (project / ".dvc" / "tmp" / "rwlock").write_text(json.dumps(lock))
        env = {**os.environ, "AMPBENCH_WARM": "0", "DVC_NO_ANALYTICS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "ampbench.dvc_run", "exp", "run", "-S", "train.lr=0.5"],
            cwd=project, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        running.kill()
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"ERROR: this project is busy: pid {running.pid} (dvc exp run -S x=1) is running its pipeline; "
        f"wait for it to end, or stop it (Ctrl-C where it runs, or kill {running.pid}), then run this again"
    ]
    assert (project / "params.yaml").read_text() == "train:\n  lr: 0.1\n"
