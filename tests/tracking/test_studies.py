"""A study has an identity: the printed link shows the latest study's variant runs only, and the
runs of earlier studies stay in the store, marked with the study that replaced them."""

from __future__ import annotations

from ampbench.tracking import studies, view
from ampbench.tracking.tracker import KIND_TAG, Tracker, temporary_env
from conftest import empty_store, mlflow_client

VARIANTS = ("single-fp32", "single-autocast")


def _study(tracker: Tracker) -> tuple[str, list[dict]]:
    rows = []
    for v in VARIANTS:
        run_id = tracker.start(v, {KIND_TAG: "variant", "variant": v}, {"variant": v})
        tracker.end(run_id, "FINISHED")
        rows.append(
            {
                "variant": v,
                "variant_run_ids": [run_id],
                **dict.fromkeys(("speedup", "test_accuracy_mean", "test_accuracy_std"), 1.0),
                **dict.fromkeys(("accuracy_delta", "p_value", "images_per_second_mean"), 1.0),
                "peak_memory_mb_mean": 1.0,
                "seeds": 3,
            }
        )
    compare_run = tracker.start("compare", {KIND_TAG: "compare"}, {"variants": ",".join(VARIANTS)})
    tracker.publish_answer(rows, compare_run)
    return compare_run, rows


def _shown(client, experiment_id: str) -> list[str]:
    """The variant runs the printed link's view lists (its filter, run through the store)."""
    state = view.decode(client.get_experiment(experiment_id).tags[view.SHARED_VIEW_TAG])
    return sorted(r.info.run_id for r in client.search_runs([experiment_id], state["searchFilter"]))


def test_a_second_study_replaces_the_first_in_the_link_and_marks_it(tmp_path):
    uri = f"sqlite:///{empty_store(tmp_path / 'mlflow.db')}"
    client = mlflow_client(uri)
    with temporary_env(MLFLOW_TRACKING_URI=uri):
        tracker = Tracker("study-identity")
        first, first_rows = _study(tracker)
        ids_first = sorted(r["variant_run_ids"][0] for r in first_rows)
        assert _shown(client, tracker.experiment_id()) == ids_first
        second, second_rows = _study(tracker)
        ids_second = sorted(r["variant_run_ids"][0] for r in second_rows)
        assert _shown(client, tracker.experiment_id()) == ids_second  # two rows, not four
        for run_id in ids_first:
            assert client.get_run(run_id).data.tags[studies.SUPERSEDED_TAG] == second
        # a later process of the same study keeps the study's filter
        Tracker("study-identity").experiment_id()
        assert _shown(client, tracker.experiment_id()) == ids_second
        # a study that reuses earlier runs (DVC's run cache) takes them back, unmarked
        compare_run = tracker.start("compare", {KIND_TAG: "compare"}, {"variants": ",".join(VARIANTS)})
        tracker.publish_answer(first_rows, compare_run)
        assert _shown(client, tracker.experiment_id()) == ids_first
        assert all(studies.SUPERSEDED_TAG not in client.get_run(r).data.tags for r in ids_first)
