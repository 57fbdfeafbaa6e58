"""Shared test helpers: a tiny prepared dataset, throwaway project folders, the stages as
subprocesses, MLflow stores and servers, and process bookkeeping. Test files import helpers from
here (never from each other); fixtures defined here are available in every test file.

Stages run as real subprocesses (`python -m ampbench ...`) in a temporary copy of the project's
params.yaml and dvc.yaml, shrunk so that a whole train stage takes seconds on 2 CPU cores. Tests
that do so are end-to-end and marked `slow` (`make test-fast` leaves them out).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import torch
import yaml

# One intra-op thread in every test process, as the stages the tests start get (clean_env:
# OMP_NUM_THREADS=1): on a busy 2-core machine two OpenMP threads spin against each other, and a
# seed trained in-process took ten times the CPU seconds of one thread. Tests that compare runs
# bit for bit still pin it themselves (one_thread).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # dvc, mlflow, torchrun of the venv that runs the tests
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# What every test project overrides in params.yaml: tiny model, tiny batches, two epochs.
TINY = {
    "model": {"fc_dim": 32},
    "train": {"epochs": 2, "batch_size": 20, "seeds": [0], "workers": 0, "checkpoint_every_s": 0, "lr": 0.05},
    "tracking": {"log_model": "reference"},
}


def make_dataset(n_train_per_class: int = 6, n_test_per_class: int = 2, seed: int = 0) -> dict:
    """Random uint8 images whose mean brightness depends on the class (so it is learnable)."""
    g = torch.Generator().manual_seed(seed)

    def split(per_class: int):
        labels = torch.arange(10).repeat_interleave(per_class)
        base = (labels * 20 + 30).view(-1, 1, 1, 1)
        noise = torch.randint(-20, 20, (len(labels), 3, 32, 32), generator=g)
        return (base + noise).clamp(0, 255).to(torch.uint8), labels

    train_x, train_y = split(n_train_per_class)
    test_x, test_y = split(n_test_per_class)
    return {
        "train_images": train_x,
        "train_labels": train_y,
        "test_images": test_x,
        "test_labels": test_y,
        "classes": list(CLASSES),
    }


def image_folder_archive(dest: Path, per_class: int = 6, test_per_class: int = 3) -> Path:
    """A tiny CIFAR-like ImageFolder archive: train/<class>/*.png, test/<class>/*.png."""
    from PIL import Image

    ds = make_dataset(n_train_per_class=per_class, n_test_per_class=test_per_class)
    root = dest / "imagefolder"
    for split in ("train", "test"):
        for i, (img, label) in enumerate(zip(ds[f"{split}_images"], ds[f"{split}_labels"])):
            folder = root / split / ds["classes"][int(label)]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img.permute(1, 2, 0).numpy()).save(folder / f"{i:04d}.png")
    archive = dest / "tiny-cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root / "train", "train")
        tar.add(root / "test", "test")
    return archive


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def write_params(project: Path, **sections) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params = _merge(_merge(params, TINY), sections)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def new_project(folder: Path, per_class: int = 6, store: bool = True, **sections) -> Path:
    """`folder` with dvc.yaml, params.yaml (TINY plus `sections`), a prepared tiny dataset and
    (``store``) an empty MLflow store (``empty_store``)."""
    from ampbench.data import prepared

    folder.mkdir(parents=True)
    shutil.copy(REPO / "dvc.yaml", folder / "dvc.yaml")
    write_params(folder, **sections)
    prepared.save_dataset(make_dataset(per_class), folder / "data" / "prepared" / "cifar10.pt")
    if store:
        empty_store(folder / "mlflow.db")
    return folder


_STORE_TEMPLATE: list[Path] = []


def empty_store(dest: Path) -> Path:
    """An empty MLflow sqlite store at `dest`, its schema complete: what the first stage of a fresh
    study would create. MLflow builds a new store by running its ~50 schema migrations, 8.7 s on
    the 2-core CI machine, in every test project; a copy of a migrated one opens in 2.5 s. So the
    migrations run once per test session and each project gets a copy. Tests of what a stage does
    to a missing or damaged store remove or overwrite the copy first."""
    if not _STORE_TEMPLATE:
        from mlflow.tracking import MlflowClient

        folder = Path(tempfile.mkdtemp(prefix="ampbench-test-store-"))
        MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        atexit.register(shutil.rmtree, folder, True)
        _STORE_TEMPLATE.append(folder / "mlflow.db")
    shutil.copy(_STORE_TEMPLATE[0], dest)
    return dest


@pytest.fixture
def project(tmp_path: Path, request) -> Path:
    """A folder with params.yaml (tiny), dvc.yaml, a prepared tiny dataset and an empty MLflow
    store; none for a test marked ``no_store`` (one that checks a refusal creates no store)."""
    return new_project(tmp_path / "proj", store=request.node.get_closest_marker("no_store") is None)


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str, **options: object):
    """A tmpfs of `size` at `folder` (more mount options as keywords: nr_inodes=300), unmounted
    afterwards; root only: the test skips, saying so, elsewhere."""
    folder.mkdir(parents=True, exist_ok=True)
    given = ",".join([f"size={size}", *(f"{k}={v}" for k, v in options.items())])
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", given, "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mount.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mount.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def venv_env(**extra: str) -> dict:
    """clean_env with the venv first on PATH (DVC runs `ampbench ...` through the shell)."""
    env = clean_env(**extra)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_cli(
    project: Path, *args: str, env: dict | None = None, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `python -m ampbench ARGS` in the project folder; fail with its output if asked."""
    proc = subprocess.run(
        [sys.executable, "-m", "ampbench", *args],
        cwd=project,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"ampbench {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def mlflow_client(store: Path | str):
    """A client of a project's sqlite store (`store`: the project folder) or of a tracking URI."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(store if isinstance(store, str) else f"sqlite:///{store / 'mlflow.db'}")


def runs(store: Path | str, experiment: str = "cifar10-amp", kind: str | None = None) -> list:
    """The runs of an experiment; `kind`: only those tagged ampbench.kind=variant|seed|compare."""
    client = mlflow_client(store)
    exp = client.get_experiment_by_name(experiment)
    found = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
    return [r for r in found if kind is None or r.data.tags.get("ampbench.kind") == kind]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 over a sqlite store in `folder` (artifacts proxied).

    ``stop()`` kills it (to test a dead server); ``start()`` brings it back on the same port.
    """

    def __init__(self, folder: Path) -> None:
        self.folder, self.port, self.proc = folder, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> MlflowServer:
        mlflow = VENV_BIN / "mlflow"
        self.proc = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.folder / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.folder / "mlartifacts"),
            ],
            cwd=self.folder,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"mlflow server did not answer within {timeout} s"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            for child in descendants(self.proc.pid):  # gunicorn/uvicorn workers
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(30)


# ------------------------------------------------------------------ processes started by tests
def descendants(pid: int) -> list[int]:
    """All live descendants of pid, e.g. torchrun and its workers."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted; None where there is none."""
    mounts = [m.mountpoint for m in psutil.disk_partitions(all=True) if m.fstype == "cgroup2"]
    return Path(mounts[0]) if mounts else None


class Procs:
    """Starts `python -m ampbench` / dvc in the background; kills what is left at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []
        self.adopted: list[int] = []  # DDP workers: torchrun starts them in sessions of their own

    def start(
        self,
        project: Path,
        *args: str,
        env: dict | None = None,
        name: str = "train",
        cmd: list[str] | None = None,
    ) -> subprocess.Popen:
        with open(project / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                cmd or [sys.executable, "-m", "ampbench", *args],
                cwd=project,
                env=env or venv_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def adopt(self, pids: list[int]) -> list[int]:
        self.adopted += pids
        return pids

    def cleanup(self) -> None:
        for pid in self.adopted:  # only if still ours: an ampbench or torchrun process
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if alive(pid) and any("ampbench" in arg for arg in process.cmdline()):
                    process.kill()
        for proc in self.started:
            if proc.poll() is None:
                for pid in [*descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()


# ------------------------------------------------------------- long runs, killed and resumed
# Long enough to be killed mid-run: 24 images per class / batch 20 = 12 steps (~1 s) per epoch.
LONG_DATA, LONG_EPOCHS = 24, 4


def long_project(folder: Path, per_class: int = LONG_DATA, epochs: int = LONG_EPOCHS, **train) -> Path:
    return new_project(folder, per_class, train={"epochs": epochs, **train})


def crash_at_step(n: int):
    """A stop check (loop.Job's ``stop``) that raises at its n-th call: a crash mid-training."""
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("crash")
        return False

    return check


def load_pt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def wait_for_checkpoint(
    proc: subprocess.Popen, path: Path, log: Path, min_epoch: int = 1, timeout: float = 240
) -> dict:
    """Poll until `path` holds a checkpoint of at least `min_epoch` completed epochs."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exit {proc.returncode} before an epoch-{min_epoch} checkpoint:\n{log.read_text()}")
        try:
            mtime = path.stat().st_mtime_ns
            if mtime != seen:
                seen, state = mtime, load_pt(path)
                if state["epoch"] >= min_epoch:
                    return state
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    pytest.fail(f"no checkpoint at epoch {min_epoch} within {timeout} s:\n{log.read_text()}")


# ------------------------------------------------------------------ make test: two xdist workers
# Modules whose tests share an expensive module fixture (a whole pipeline run, a study's store):
# make test's scheduler (`--dist loadgroup`, below) keeps each on one worker, so the fixture is
# built once; every other test is scheduled alone, which balances the two workers best.
GROUPED_MODULES = {
    "tests/pipeline/test_pipeline.py",
    "tests/pipeline/test_views.py",
    "tests/tracking/test_mlflow_view.py",
    "tests/training/test_train.py",
}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` by module: xdist's own groups (`xdist_group` marks) tag node ids in a way
    pytest 9 ignores, so every test would be scheduled alone and a module fixture built per worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in GROUPED_MODULES else nodeid

    return ByModule(config, log)


# ------------------------------------------------------- the train stage, faulted and resumed
SINGLE = ("train", "--parallel", "single", "--precision", "fp32")
DDP = ("train", "--parallel", "ddp", "--precision", "fp32")
SEED0 = Path("models/single-fp32/seed-0")  # the published model.pt of a finished stage
WORK = Path("checkpoints/single-fp32")  # the stage's work in progress (no DVC output)
WORK0 = WORK / "seed-0"  # checkpoint.pt, run.json, model.pt of a seed in progress
DDP_WORK0 = Path("checkpoints/ddp-fp32/seed-0")

# Fault injection: the code has no fault hook. Tests that need a worker to crash put this
# ``sitecustomize.py`` on PYTHONPATH (``hook_env``); it makes ``step.Step`` raise at a chosen step
# in a chosen rank, or makes importing mlflow fail in a rank; nothing in src/ knows about it.
TEST_HOOK = '''
"""Test-only hooks (tests/conftest.py TEST_HOOK), active only when their variable is set.

AMPBENCH_TEST_FAULT=<rank>:<step>: step.Step raises at that step in that rank.
AMPBENCH_TEST_NO_MLFLOW=<rank>,...: importing mlflow fails in those ranks.
"""
import os
import sys

if os.environ.get("RANK") in os.environ.get("AMPBENCH_TEST_NO_MLFLOW", "").split(","):

    class _NoMlflow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "mlflow":
                raise ImportError(f"rank {os.environ['RANK']} imported {name}: only rank 0 may use MLflow")

    sys.meta_path.insert(0, _NoMlflow())

_spec = os.environ.get("AMPBENCH_TEST_FAULT", "")
if _spec and os.environ.get("RANK", "0") == _spec.split(":")[0]:
    from ampbench.training import step

    _at, _step = int(_spec.split(":")[1]), step.Step.__call__

    def _faulty(self, images, labels):
        if self.calls + 1 >= _at:
            raise RuntimeError(f"injected fault: rank {os.environ.get('RANK', '0')} step {self.calls + 1}")
        return _step(self, images, labels)

    step.Step.__call__ = _faulty
'''


def hook_env(tmp_path: Path, **variables: str) -> dict:
    """Environment that loads TEST_HOOK (a sitecustomize.py) with the given AMPBENCH_TEST_* set."""
    hook = tmp_path / "test-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(TEST_HOOK)
    # Keep a PYTHONPATH that puts the code under test first (a worktree's src/): without it the
    # workers would import whatever ampbench the venv has installed.
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return venv_env(PYTHONPATH=pythonpath, **variables)


def stage_log(project: Path, name: str = "train") -> str:
    """What a stage started by ``procs.start(..., name=name)`` wrote."""
    return (project / f"{name}.log").read_text(errors="replace")


def wait_exit(proc: subprocess.Popen, timeout: float, log: Path) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {timeout} s after the signal:\n{log.read_text()}")


def run_status(project: Path, run_id: str) -> str:
    return mlflow_client(project).get_run(run_id).info.status


def run_json(project: Path, work0: Path = WORK0) -> dict:
    return json.loads((project / work0 / "run.json").read_text())


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"weights differ from the uninterrupted run in {differ}"


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def paced(line: str) -> bool:
    """A line a slow or loaded machine adds to a command's own (measuring/pace.py between measured
    pieces, stages/starting.py before the first line): not part of what a test checks in order."""
    return any(f" INFO {name}: " in line for name in ("ampbench.measuring.pace", "ampbench.stages.starting"))


@pytest.fixture
def handlers():
    """The stop signals' handlers put back after a test that installs a stage's own (StopFlag)."""
    from ampbench.stages.stop import STOP_SIGNALS

    saved, hook = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}, sys.unraisablehook
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    sys.unraisablehook = hook  # and the finalizers' hook a StopFlag sets
