"""Screenshots of the MLflow UI over a study's store, as a new user sees it (fresh browser profile).

    .venv/bin/python scripts/ui_screenshots.py                      # mlflow.db at the repo root
    .venv/bin/python scripts/ui_screenshots.py --store /path/mlflow.db --out docs/img

Starts `mlflow server` on a free 127.0.0.1 port over the store, opens the link the pipeline prints
(the study's runs, training view) in headless Chromium (Debian's `chromium`: `apt-get install
chromium`) and writes docs/img/mlflow-runs.png (the nine variant rows) and
docs/img/mlflow-charts.png (their charts). tests/test_pipeline.py uses `render` to check the
link in a browser.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--store", type=Path, default=REPO / "mlflow.db", help="sqlite store (default: %(default)s)"
    )
    p.add_argument("--experiment", default="cifar10-amp")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = p.parse_args()
    if not chromium():
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    if not args.store.exists():
        raise SystemExit(f"{args.store}: no such store; run the study first (make run) or pass --store")
    proc, uri = serve(args.store)
    try:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        sys.path.insert(0, str(REPO / "src"))
        from ampbench.tracking.tracker import Tracker

        link = Tracker(args.experiment).link()  # exactly what the pipeline prints
        args.out.mkdir(parents=True, exist_ok=True)
        render(link.replace("&compareRunsMode=CHART", ""), args.out / "mlflow-runs.png", size="1600,700")
        render(link, args.out / "mlflow-charts.png", budget_ms=90000, size="1600,2200")
        print(f"{link}\nwrote {args.out / 'mlflow-runs.png'} and {args.out / 'mlflow-charts.png'}")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
