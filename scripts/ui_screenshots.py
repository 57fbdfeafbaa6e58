"""Headless Chromium over the MLflow UI, as a new user sees it (fresh browser profile): helpers.

`serve(store)` starts `mlflow server` on a free 127.0.0.1 port over a store; `render(url)` returns
a page's DOM after some virtual time and can write a PNG (Debian's `chromium`: `apt-get install
chromium`). scripts/mlflow_screenshots.py writes docs/img with them; tests/pipeline/test_pipeline.py and
tests/tracking/test_mlflow_view.py use them to check the printed link in a browser.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# As root in a container: no sandbox; no background traffic (the network is closed here).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, screenshot: Path | None = None, budget_ms: int = 30000, size: str = "1600,1000") -> str:
    """The page's DOM after `budget_ms` of virtual time, in a fresh profile; optionally a PNG too."""
    with tempfile.TemporaryDirectory() as profile:
        args = [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            f"--window-size={size}",
        ]
        if screenshot:
            subprocess.run(
                [*args, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=True
            )
        out = subprocess.run(
            [*args, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True
        )
    return out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(store: Path, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [
            str(mlflow),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{store.resolve()}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5):
                return proc, uri
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"mlflow server exited {proc.returncode}") from None
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"mlflow server did not answer within {timeout} s")
