"""The MLflow pages beside the printed link's table, as a new user's first screen (a fresh headless
Chromium profile, 1280x800, a real `mlflow server` over a tiny study written by the project's own
tracking code; test_mlflow_view.py's helpers): the chart view names the variants and titles its
answer whole, the experiment is described, and a seed run's page shows its answer. What MLflow
cannot be made to show there is said in docs/MLFLOW.md "What MLflow cannot be made to do"."""

from __future__ import annotations

import json

import pytest
from test_mlflow_view import VARIANTS, _printed_link, _ui, browse, tiny_study

from conftest import MlflowServer, mlflow_client

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# Which of TEXTS a user sees whole: an element whose own text is exactly it, inside the window,
# not covered, and not cut (an ellipsis: its content wider than its box).
WHOLE = """(TEXTS).map(text => {
  for (const el of document.querySelectorAll('body *')) {
    if (el.childElementCount || el.textContent.trim() !== text) continue;
    const r = el.getBoundingClientRect();
    const inside = r.width > 0 && r.left >= 0 && r.right <= innerWidth
      && r.top >= 0 && r.bottom <= innerHeight;
    // its first and last corner not covered nor clipped by a parent (a wrapped second line is)
    const corners = [[r.left + 1, r.top + 2], [r.right - 1, r.bottom - 2]];
    const hits = inside && corners.map(([x, y]) => document.elementFromPoint(x, y));
    const ours = hits && hits.every(hit => hit && (el.contains(hit) || hit.contains(el)));
    let clipped = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
    for (let a = el.parentElement; a && !clipped; a = a.parentElement) {
      const b = a.getBoundingClientRect(), style = getComputedStyle(a);
      clipped = style.overflow !== 'visible' && (b.bottom < r.bottom - 1 || b.right < r.right - 1);
    }
    if (ours && !clipped) return true;
  }
  return false;
})"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    if not _ui().chromium():
        pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("mlflow-pages")
    rows = tiny_study(folder)
    server = MlflowServer(folder).start()
    yield server, rows, folder / "screens"
    server.stop()


def _whole(url: str, texts: list[str], png, ready: str) -> dict[str, bool]:
    seen = browse(url, WHOLE.replace("TEXTS", json.dumps(texts)), ready, png)
    return dict(zip(texts, seen or [False] * len(texts), strict=True))


def test_the_chart_view_names_the_variants_and_titles_the_speedup_whole(study):
    from ampbench.tracking import view

    server, _, shots = study
    url = _printed_link(server.uri).replace("compareRunsMode=TABLE", "compareRunsMode=CHART")
    first = view.ANSWER[0][1]
    assert first == "answer/speedup_vs_single_fp32" and view.ANSWER[1][1] == "answer/test_accuracy_pct"
    seen = _whole(
        url, [first, *VARIANTS], shots / "chart-view.png", "document.querySelector('.js-plotly-plot')"
    )
    assert all(seen.values()), f"not whole on the first screen (see {shots / 'chart-view.png'}): {seen}"


def test_the_experiment_is_described_on_its_pages_and_in_the_list(study):
    """The experiment's one-line description: whole above its runs, and in MLflow's experiments list."""
    from ampbench.tracking import view

    server, rows, shots = study
    client = mlflow_client(server.uri)
    note = client.get_experiment_by_name("cifar10-amp").tags[view.NOTE_TAG]
    best = max(rows, key=lambda r: r["speedup"])
    assert (
        note.startswith("AMP x data parallelism")
        and f"fastest {best['variant']} {best['speedup']:.2f}x" in note
    )
    ready = f"document.body.innerText.includes({json.dumps(best['variant'])})"
    seen = _whole(_printed_link(server.uri), [note], shots / "described.png", ready)
    assert seen[note], f"the description is not whole on the first screen: see {shots / 'described.png'}"
    listing = f"{server.uri}/#/experiments?workflowType=machine_learning"
    text = browse(
        listing,
        "document.body.innerText",
        "document.body.innerText.includes('cifar10-amp')",
        shots / "list.png",
    )
    assert note in text, text[:1500]


def test_a_seed_runs_page_shows_its_own_answer_on_the_first_screen(study):
    from test_mlflow_view import TAGS_SEEN

    from ampbench.tracking import view

    server, rows, shots = study
    client = mlflow_client(server.uri)
    experiment = client.get_experiment_by_name("cifar10-amp").experiment_id
    seed = client.search_runs(
        [experiment], "tags.`ampbench.kind` = 'seed' and tags.variant = 'single-autocast'"
    )[0]
    tags = {k: seed.data.tags[k] for k in ("speed-up", "accuracy", "images/s", "peak MB")}
    assert tags["speed-up"].endswith("x") and tags["accuracy"].endswith("%"), tags
    note = seed.data.tags[view.NOTE_TAG]
    row = next(r for r in rows if r["variant"] == "single-autocast")
    assert (
        note.startswith(f"{seed.info.run_name}: test accuracy {tags['accuracy']}")
        and view.summary_line(row) in note
    )
    pairs = list(tags.items())
    seen = browse(
        view.run_link(server.uri, experiment, seed.info.run_id),
        TAGS_SEEN.replace("PAIRS", json.dumps(pairs)),
        f"document.body.innerText.includes({json.dumps(tags['accuracy'])})",
        shots / "seed-run-page.png",
    )
    assert seen == [True] * len(pairs), f"{dict(zip(tags, seen or []))} (see {shots / 'seed-run-page.png'})"
