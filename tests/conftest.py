"""Shared fixtures: a tiny prepared dataset and a throwaway project folder to run stages in.

Stages run as real subprocesses (`python -m ampbench ...`) in a temporary copy of the project's
params.yaml and dvc.yaml, shrunk so that a whole train stage takes seconds on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# What every test project overrides in params.yaml: tiny model, tiny batches, two epochs.
TINY = {
    "model": {"fc_dim": 32},
    "train": {"epochs": 2, "batch_size": 20, "seeds": [0], "workers": 0, "checkpoint_every_s": 0,
              "lr": 0.05},
    "tracking": {"log_model": False},
}  # fmt: skip


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
    return {"train_images": train_x, "train_labels": train_y, "test_images": test_x,
            "test_labels": test_y, "classes": list(CLASSES)}  # fmt: skip


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


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with params.yaml (tiny), dvc.yaml and a prepared tiny dataset."""
    from ampbench import data

    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "dvc.yaml", proj / "dvc.yaml")
    write_params(proj)
    data.save_dataset(make_dataset(), proj / "data" / "prepared" / "cifar10.pt")
    return proj


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def run_cli(project: Path, *args: str, env: dict | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess:  # fmt: skip
    """Run `python -m ampbench ARGS` in the project folder; fail with its output if asked."""
    proc = subprocess.run(
        [sys.executable, "-m", "ampbench", *args], cwd=project, env=env or clean_env(),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if check and proc.returncode != 0:
        pytest.fail(f"ampbench {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def mlflow_client(project: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{project / 'mlflow.db'}")


def runs(project: Path, experiment: str = "cifar10-amp") -> list:
    client = mlflow_client(project)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


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
        mlflow = Path(sys.executable).parent / "mlflow"
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
             "--artifacts-destination", str(self.folder / "mlartifacts")],
            cwd=self.folder, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
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
            for child in _children(self.proc.pid):  # gunicorn/uvicorn workers
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(30)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                child = int(stat.parent.name)
                out += [child, *_children(child)]
    return out
