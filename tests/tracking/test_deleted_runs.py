"""A run in the store's trash that a train stage would go on with (hostile pass H: a seed run
deleted while its stage was stopped failed every resume with "MLflow store ... failed (... must be
in the 'active' state)", the store blamed; a deleted variant run was replaced without a word while
its seeds finished under it). And a store outage under `--fresh` names the command that sends the
kept model (hostile pass H: "re-run the same command", --fresh included, trained the seed again)."""

from __future__ import annotations

import types

import pytest
from test_fresh_runs import _stage_and_job

from ampbench.tracking import train_runs
from ampbench.tracking.store import TrackingError


def _deleted_line(run_id: str, uri: str) -> str:
    return f"MLflow run {run_id} is deleted in store {uri} (in its trash)"


def test_a_deleted_variant_run_is_named_with_restore_and_fresh(tmp_path, monkeypatch):
    stage, job, _ = _stage_and_job(tmp_path, monkeypatch)
    cfg, work, tracker = job.cfg, job.checkpoint_path.parent.parent, stage.tracker
    first = train_runs.variant_run(tracker, work, "single-fp32", cfg)
    tracker.end(first, "KILLED")
    tracker.client.delete_run(first)
    with pytest.raises(TrackingError) as refused:
        train_runs.variant_run(tracker, work, "single-fp32", cfg)
    said = str(refused.value)
    assert said.startswith("single-fp32: the variant's " + _deleted_line(first, tracker.uri)), said
    assert f"mlflow runs restore --run-id {first}`" in said
    assert "`ampbench train --parallel single --precision fp32 --fresh`" in said
    with pytest.raises(TrackingError) as refused:  # the stage's own command, its --set kept
        train_runs.variant_run(tracker, work, "single-fp32", cfg, again="ampbench train --set x=1 --fresh")
    assert "afresh (`ampbench train --set x=1 --fresh`; its kept work is discarded)" in str(refused.value)
    tracker.client.restore_run(first)  # the fix it names
    assert train_runs.variant_run(tracker, work, "single-fp32", cfg) == first
    tracker.client.delete_run(first)  # the other fix: a new run
    assert train_runs.variant_run(tracker, work, "single-fp32", cfg, fresh=True) != first


def test_a_seed_run_deleted_while_its_stage_was_stopped_is_named_on_resume(tmp_path, monkeypatch):
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    run_id = train_runs.seed_run(stage, job, "single-fp32", digest, {})
    stage.tracker.end(run_id, "KILLED")  # a stop: its checkpoint names the run
    stage.tracker.client.delete_run(run_id)
    resume = types.SimpleNamespace(run_id=run_id, hooks=None)
    with pytest.raises(TrackingError) as refused:
        train_runs.open_seed_run(stage, job, "single-fp32", digest, {}, resume)
    assert str(refused.value).startswith("single-fp32: seed 0's " + _deleted_line(run_id, stage.tracker.uri))
    assert stage.tracker.client.get_run(run_id).info.lifecycle_stage == "deleted"  # nothing else done


def test_a_checkpoints_run_of_another_store_is_named_not_the_store(tmp_path, monkeypatch):
    """Hostile pass T: a stage stopped under another MLFLOW_TRACKING_URI, resumed under this one:
    "MLflow store ... failed (MlflowException: Run with id=... not found); check the store"."""
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    elsewhere = "ab" * 16  # a run of another store
    resume = types.SimpleNamespace(run_id=elsewhere, hooks=None)
    with pytest.raises(TrackingError) as refused:
        train_runs.open_seed_run(stage, job, "single-fp32", digest, {}, resume)
    said = str(refused.value)
    assert said.startswith(
        f"single-fp32: seed 0's MLflow run {elsewhere}, which its kept work continues, is not in store "
        f"{stage.tracker.uri}: point MLFLOW_TRACKING_URI at the store that holds them"
    ), said
    assert (
        "afresh (`ampbench train --parallel single --precision fp32 --fresh`; its kept work is discarded)"
        in said
    )


def _saved(run_id: str) -> types.SimpleNamespace:
    result = types.SimpleNamespace(params=dict, metrics=dict, diverged=False)
    return types.SimpleNamespace(
        run_id=run_id, result=result, seed=0, variant="single-fp32", pending_metrics=[], history=[]
    )


def test_a_finished_seeds_deleted_run_is_named_not_the_store(tmp_path, monkeypatch):
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    run_id = train_runs.seed_run(stage, job, "single-fp32", digest, {})
    stage.tracker.client.delete_run(run_id)
    with pytest.raises(TrackingError) as refused:
        train_runs.close_seed_run(stage, _saved(run_id), tmp_path / "model.pt")
    assert _deleted_line(run_id, stage.tracker.uri) in str(refused.value)


@pytest.mark.parametrize("fresh", [False, True])
def test_a_store_outage_names_the_command_that_sends_the_kept_model(tmp_path, monkeypatch, fresh):
    stage, job, digest = _stage_and_job(tmp_path, monkeypatch)
    run_id = train_runs.seed_run(stage, job, "single-fp32", digest, {})
    stage.fresh = fresh

    def down(*args, **kwargs):
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(stage.tracker, "log_params", down)
    with pytest.raises(TrackingError) as failed:
        train_runs.close_seed_run(stage, _saved(run_id), tmp_path / "model.pt")
    same = "re-run the same command without --fresh;" if fresh else "re-run the same command;"
    assert same in str(failed.value), failed.value


def test_the_fresh_command_is_the_stages_own_with_its_settings():
    """Hostile pass J: the deleted-run line offered `ampbench train --parallel single --precision
    fp32 --fresh`, which trained params.yaml's settings, not the user's `--set` ones."""
    from ampbench.checkpoints.work import fresh_command

    argv = ["train", "--parallel", "single", "--precision", "fp32", "--set", "train.seeds=[0]"]
    assert fresh_command(argv) == (
        "ampbench train --parallel single --precision fp32 --set 'train.seeds=[0]' --fresh"
    )
    assert fresh_command([*argv, "--fresh"]) == fresh_command(argv)  # once


def test_a_changed_configs_fresh_fix_keeps_the_stages_settings_too(monkeypatch):
    """Hostile pass L: "Resuming would mix two experiments ... start over: `ampbench train --parallel
    single --precision fp32 --fresh`", run as printed, trained params.yaml's settings; so did the
    "does not fit this model" line's."""
    from pathlib import Path

    from ampbench.checkpoints import work

    monkeypatch.delenv("DVC_STAGE", raising=False)
    ckpt = Path("checkpoints/single-fp32/seed-0/checkpoint.pt")
    argv = ["train", "--parallel", "single", "--precision", "fp32", "--set", "train.epochs=4"]
    bare = "`ampbench train --parallel single --precision fp32 --fresh`"
    assert work._fresh_command("single-fp32", ckpt) == bare  # noqa: SLF001 - outside a stage
    with work.stage_command(argv):
        said = work._fresh_command("single-fp32", ckpt)  # noqa: SLF001 - what both lines print
    assert said == "`ampbench train --parallel single --precision fp32 --set train.epochs=4 --fresh`"
    assert work._fresh_command("single-fp32", ckpt) == bare  # noqa: SLF001 - put back after the stage


@pytest.mark.parametrize("pipeline", ["make run", ""])
def test_under_dvc_a_changed_configs_fix_names_the_pipeline(monkeypatch, pipeline):
    """Hostile pass O: under `python -m ampbench.dvc_run repro`, params changed after a stop: the
    fix `ampbench train ... --fresh` trained the variant, left dvc.lock stale, and the pipeline then
    trained it a second time."""
    from pathlib import Path

    from ampbench.checkpoints import work

    monkeypatch.setenv("DVC_STAGE", "train@single-fp32")
    monkeypatch.setenv("AMPBENCH_RESUME_COMMAND", pipeline)
    with work.stage_command(["train", "--parallel", "single", "--precision", "fp32"]):
        said = work._fresh_command("single-fp32", Path("checkpoints/single-fp32/seed-0/checkpoint.pt"))  # noqa: SLF001
    again = pipeline or "the pipeline command that started this stage"
    assert said == f"`rm -r checkpoints/single-fp32`, then {again} again", said


def test_a_publish_refused_after_fresh_names_the_command_without_it():
    """Hostile pass M: models/ read-only at publish under `--fresh`: "re-run the same command: the
    models wait in checkpoints/ and are not trained again"; the same command, --fresh included,
    trained every seed again. And "sudo chown" for a read-only filesystem, which changes nothing."""
    import errno
    from pathlib import Path

    from ampbench.checkpoints import work

    refused = OSError(errno.EROFS, "Read-only file system", "models/.single-fp32.publishing")
    argv = ["train", "--parallel", "single", "--precision", "fp32", "--set", "train.epochs=2", "--fresh"]
    with work.stage_command(argv):
        said = work._publish_failed(refused, Path("checkpoints/single-fp32"), Path("models/single-fp32"))  # noqa: SLF001
    assert said == (
        "could not publish the trained models into models/single-fp32: its filesystem is read-only; "
        "mount it writable, then re-run `ampbench train --parallel single --precision fp32 --set "
        "train.epochs=2`: the models wait in checkpoints/single-fp32/ and are not trained again"
    ), said
