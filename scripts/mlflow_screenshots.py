"""Screenshots of a study's store in the MLflow UI, as a new user's first screen (fresh profile,
1280x800): the link the project prints, its chart view, a variant run's page, a seed run's page
and the Models tab.

    .venv/bin/python scripts/mlflow_screenshots.py                     # mlflow.db at the repo root
    .venv/bin/python scripts/mlflow_screenshots.py /path/to/mlflow.db --out docs/img

Starts `mlflow server` on a free 127.0.0.1 port over the store (helpers of ui_screenshots.py:
Debian's headless `chromium`), writes docs/img/mlflow-{answer,answer-charts,variant-run,seed-run,
models}.png and prints each link. Look at them: tests/tracking/test_mlflow_view.py checks the first one
on a tiny study, not on a real one.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCREEN = "1280,800"


def _ui_helpers():
    spec = importlib.util.spec_from_file_location("ui_screenshots", REPO / "scripts" / "ui_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def links(uri: str, experiment: str) -> dict[str, str]:
    """Screenshot name -> the page's link, for a store served at `uri`."""
    from mlflow.tracking import MlflowClient

    from ampbench.tracking import view
    from ampbench.tracking.tracker import Tracker

    tracker = Tracker(experiment)
    printed, exp_id = tracker.link(), tracker.experiment_id()
    client, kinds = MlflowClient(uri), {}
    for kind in ("variant", "seed"):  # the fastest variant, and one of its seeds
        found = client.search_runs(
            [exp_id], f"tags.`ampbench.kind` = '{kind}'", order_by=[f"metrics.`{view.ANSWER[0][1]}` DESC"]
        )
        if found:
            kinds[kind] = found[0].info.run_id
    out = {
        "mlflow-answer": printed,
        "mlflow-answer-charts": printed.replace("compareRunsMode=TABLE", "compareRunsMode=CHART"),
    }
    for kind in ("variant", "seed"):
        if kind in kinds:
            out[f"mlflow-{kind}-run"] = view.run_link(uri, exp_id, kinds[kind])
    out["mlflow-models"] = view.models_link(uri, exp_id)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "store", nargs="?", type=Path, default=REPO / "mlflow.db", help="sqlite store (%(default)s)"
    )
    p.add_argument("--experiment", default="cifar10-amp")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = p.parse_args()
    ui = _ui_helpers()
    if not ui.chromium():
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    if not args.store.exists():
        raise SystemExit(f"{args.store}: no such store; run the study first (make run) or pass its mlflow.db")
    proc, uri = ui.serve(args.store)
    try:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        sys.path.insert(0, str(REPO / "src"))
        args.out.mkdir(parents=True, exist_ok=True)
        for name, url in links(uri, args.experiment).items():
            png = args.out / f"{name}.png"
            ui.render(url, png, budget_ms=30000, size=SCREEN)
            print(f"{png}  <-  {url}")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
