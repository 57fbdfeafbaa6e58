"""How a study opens in the MLflow UI: the answer on the first screen.

The link the project prints (``store.runs_link``) opens the experiment's runs table through the
UI's shared-view mechanism (its Share button): the view state is an experiment tag
``mlflow.sharedViewState.<SHARE_KEY>`` (``Tracker.experiment_id`` stores it) and the link carries
``viewStateShareKey=<SHARE_KEY>``. The view shows the nine variant runs only (not their seeds),
sorted by speed-up, and one column: each variant run's description, which starts with its answer
in one line (``summary_line``: speed-up over single-fp32, test accuracy ± std and its difference,
images/s, peak memory). No metric column: a second header row would push a row off a 800-pixel
screen, where the experiment's one-line description (``experiment_note``, also in MLflow's
experiments list) already leaves eight of the nine on the first screen (docs/MLFLOW.md says why).
The numbers are also ``answer/*`` metrics on each variant run (rounded where the digits are
noise): the chart view opens on an ``answer`` section of bar charts, one per row, one colour per
variant. Seed runs get their own answer as tags and description; the compare run's description
holds the study's table (``study_note``).

UI-INTERNAL FORMAT, read from mlflow 3.17's JS bundle (mlflow/server/js/build/static/js): the tag
value is ``deflate;`` + base64 of the zlib-deflated JSON; the JSON's keys are the runs page's
search facets (searchFilter, orderByKey, orderByAsc, ...) and UI state (selectedColumns,
compareRunCharts, compareRunSections, runsHiddenMode, ...); a column is ``metrics.`<key>```.
No public API sets it. tests/tracking/test_mlflow_view.py opens the link in a real browser and fails when
a new MLflow reads it differently.
"""

from __future__ import annotations

import base64
import json
import math
import zlib

from ampbench.tracking import studies
from ampbench.tracking.answer_notes import (  # noqa: F401 (the answer's words, used through view)
    ANSWER_TAGS,
    BASELINE,
    answer_tags,
    experiment_note,
    seed_note,
    seed_tags,
    study_note,
    summary_line,
    variant_note,
)

SHARE_KEY = "answer"  # store.runs_link puts it in the printed link
SHARED_VIEW_TAG = "mlflow.sharedViewState." + SHARE_KEY
NOTE_TAG = "mlflow.note.content"  # a run's or experiment's description in the UI
COLOR_TAG = "mlflow.runColor"  # a run's colour in the charts
KIND_FILTER = studies.KIND_FILTER

# The answer as metrics: (key of a report.compare row, MLflow metric name, scale, digits kept).
# Accuracy in percent: the UI's bar labels show two decimals, which for a fraction hides every
# difference (0.84 vs 0.84); in percent two decimals resolve one image in 10,000.
# In the chart view's order: the speed-up and the accuracy first.
ANSWER = (
    ("speedup", "answer/speedup_vs_single_fp32", 1, 2),
    ("test_accuracy_mean", "answer/test_accuracy_pct", 100, 2),
    ("accuracy_delta", "answer/accuracy_delta_pct_points", 100, 2),
    ("images_per_second_mean", "answer/images_per_s", 1, 0),
    ("peak_memory_mb_mean", "answer/peak_memory_mb", 1, 0),
    ("test_accuracy_std", "answer/test_accuracy_std_pct", 100, 2),
)
DESCRIPTION = "attributes.`Description`"  # the runs table's column of run descriptions
DESCRIPTION_WIDTH = 560

# One colour per variant (two variants never share one): parallel sets the hue family,
# precision the shade.
COLORS = {
    "single-fp32": "#1f4e9c",
    "single-autocast": "#3d85d8",
    "single-autocast_gradscaler": "#8fbdf0",
    "dp-fp32": "#a3480f",
    "dp-autocast": "#e6791e",
    "dp-autocast_gradscaler": "#f5b971",
    "ddp-fp32": "#1e7a3a",
    "ddp-autocast": "#38b05c",
    "ddp-autocast_gradscaler": "#93d9a6",
}


def encode(state: dict) -> str:
    """The tag value the UI decodes: ``deflate;`` + base64(zlib(JSON))."""
    raw = json.dumps(state, separators=(",", ":")).encode()
    return "deflate;" + base64.b64encode(zlib.compress(raw, 9)).decode()


def decode(value: str) -> dict:
    if not value.startswith("deflate;"):
        return json.loads(value)
    return json.loads(zlib.decompress(base64.b64decode(value[len("deflate;") :])))


def _section(uuid: str, name: str) -> dict:
    # One chart per row: a card of a three-per-row section at 1280 pixels (beside the runs list
    # and the assistant panel) is 170 pixels wide, which cut its title to "answer…".
    return {
        "uuid": uuid,
        "name": name,
        "display": True,
        "isReordered": False,
        "columns": 1,
        "cardHeight": 300,
    }


def _bar(uuid: str, section: str, metric: str) -> dict:
    return {
        "uuid": uuid,
        "type": "BAR",
        "runsCountToCompare": 10,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        "metricKey": metric,
        "displayName": metric.split("/")[-1],
    }


def view_state(study: str | None = None) -> dict:
    """The shared view: the study's variant runs with their answer line, and the answer charts first."""
    metrics = [name for _, name, _, _ in ANSWER]
    # The description (its first line is the answer) only: a metric column adds a header row to
    # the table and the ninth row falls off a 800-pixel screen. The numbers are the charts' (and
    # a click away as columns: "Columns" -> answer/...).
    columns = [DESCRIPTION]
    charts = [_bar(f"answer-{i}", "answer-section", m) for i, m in enumerate(metrics)]
    return {
        "searchFilter": studies.runs_filter(study),
        "orderByKey": f"metrics.`{ANSWER[0][1]}`",
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": {DESCRIPTION: DESCRIPTION_WIDTH},
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        "compareRunSections": [_section("answer-section", "answer")],
        "isAccordionReordered": True,  # keep `answer` first; the UI appends the other sections
        "hideEmptyCharts": True,
        "useGroupedValuesInCharts": True,
        "viewMaximized": False,
        "runListHidden": False,
        "groupBy": None,
        "groupsExpanded": {},
    }


def ensure_shared_view(client, experiment, study: str | None = None) -> None:
    """Give the experiment (an mlflow Experiment) the shared view the printed link opens: of
    `study`, or of the study the view already shows (a later stage's process keeps it)."""
    current = experiment.tags.get(SHARED_VIEW_TAG)
    if study is None and current:
        study = studies.of_filter(decode(current).get("searchFilter", ""))
    value = encode(view_state(study))
    if experiment.tags.get(SHARED_VIEW_TAG) != value:
        client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG, value)


def answer_metrics(row: dict) -> dict[str, float]:
    """A comparison row's answer, rounded where the digits are noise (NaN left out)."""
    out = {}
    for key, name, scale, digits in ANSWER:
        value = row.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            out[name] = round(float(value) * scale, digits)
    return out


def publish(tracker, rows: list[dict], compare_run_id: str | None = None, notice: str = "") -> None:
    """The compare stage's answer in the UI: metrics, colour and note on every variant run and
    its seed runs, the study's table as the compare run's note, the experiment's description,
    and the shared view the printed link opens."""
    study = compare_run_id
    ours = {run_id for row in rows for run_id in row.get("variant_run_ids", [])}
    for row in rows:
        for run_id in row.get("variant_run_ids", []):
            publish_row(tracker, run_id, row, study)
    if compare_run_id:
        tracker.set_tags(compare_run_id, {NOTE_TAG: study_note(rows, notice), studies.STUDY_TAG: study})
        studies.mark_earlier(tracker, ours, study)
    experiment = tracker.client.get_experiment(tracker.experiment_id())
    if rows and compare_run_id:
        tracker.client.set_experiment_tag(experiment.experiment_id, NOTE_TAG, experiment_note(rows, notice))
    ensure_shared_view(tracker.client, experiment, study)


def publish_row(tracker, run_id: str, row: dict, study: str | None = None, note: str = "") -> None:
    """One variant's answer on its run (compare's, and `mlflow run`'s): the `answer/*` metrics,
    the description (`note` added), the answer tags, its colour and its study; and each of its
    seed runs' own answer (seed_tags, seed_note)."""
    from mlflow.entities import RunTag

    tracker.log_changed(run_id, answer_metrics(row))
    tags = {
        NOTE_TAG: variant_note(row) + (f"\n\n{note}" if note else ""),
        **answer_tags(row),
        **({studies.STUDY_TAG: study} if study else {}),
    }
    if row["variant"] in COLORS:
        tags[COLOR_TAG] = COLORS[row["variant"]]
    tracker.set_tags(run_id, tags)
    found = tracker.client.search_runs(
        [tracker.experiment_id()], f"tags.`mlflow.parentRunId` = '{run_id}'", max_results=1000
    )
    for seed in found:
        metrics = seed.data.metrics
        seed_answer = {NOTE_TAG: seed_note(seed.info.run_name, metrics, row), **seed_tags(metrics, row)}
        tracker.client.log_batch(seed.info.run_id, tags=[RunTag(k, v) for k, v in seed_answer.items()])


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the model-training workflow (a fresh browser opens GenAI otherwise)."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def models_link(base: str, experiment_id: str) -> str:
    """The experiment's Models tab in the model-training workflow."""
    return f"{base}/#/experiments/{experiment_id}/models?workflowType=machine_learning"
