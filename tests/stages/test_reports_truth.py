"""One study, one truth in the reports: compare refuses variants trained with different settings
(or labels them with --allow-mixed), evaluate and compare write their reports all or nothing
(outputs.staged), and compare prints under any output encoding."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from ampbench import outputs
from ampbench.report import mixed
from ampbench.seed_result import CARRIED, SeedResult
from conftest import CLASSES, REPO, new_project, run_cli, venv_env

PAIR = ("single-fp32", "single-autocast")


def _record(variant: str, digest: str = "d1", **settings) -> dict:
    seeds = [
        {
            "seed": seed,
            "run_id": f"{variant}-{seed}",
            "variant_run_id": None,
            "config_digest": digest,
            "test_accuracy": 0.5 + seed / 100,
            "train_seconds": 10.0 + seed,
            "images_per_second": 1000.0 + seed,
            "peak_memory_mb": 100.0,
            "diverged": False,
            "devices_used": 1,
            "device_name": "cpu",
            "amp_dtype": "float32",
            "epoch_cv": 0.01,
            "train.epochs": 2,
            "train.batch_size": 20,
            "tracking.conditions": "project",
            **settings,
        }
        for seed in (0, 1)
    ]
    return {"variant": variant, "seeds": seeds}


def _write_metrics(project: Path, records: dict) -> None:
    folder = project / "reports" / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    for variant, record in records.items():
        (folder / f"{variant}.json").write_text(json.dumps(record))


def _odd() -> dict:
    """single-autocast trained for 5 epochs, single-fp32 for 2."""
    five = {"train.epochs": 5}
    return {"single-fp32": _record("single-fp32"), "single-autocast": _record("single-autocast", **five)}


# ---------------------------------------------------------------- one configuration per study
def test_variants_trained_alike_pass_and_any_other_setting_is_named():
    alike = {v: _record(v) for v in PAIR}
    assert mixed.check(alike, allow_mixed=False) == ""
    odd = _odd()
    with pytest.raises(mixed.MixedSettingsError) as err:
        mixed.check(odd, allow_mixed=False)
    message = str(err.value)
    assert "train.epochs: 2 (single-fp32) vs 5 (single-autocast)" in message and "--allow-mixed" in message
    assert "\n" not in message
    # hostile pass WARN: "re-train the odd ones ... (dvc repro)": which are odd, and how, after a make run?
    assert "set params.yaml to the settings the study should have and run the pipeline again" in message
    assert "(`make run` or `dvc repro`: it re-trains the variants trained otherwise)" in message
    label = mixed.check(odd, allow_mixed=True)
    assert "MIXED SETTINGS" in label and "train.epochs: 2 (single-fp32) vs 5 (single-autocast)" in label


def test_a_setting_the_files_do_not_carry_is_caught_by_the_config_digest():
    records = {v: _record(v, digest) for v, digest in zip(PAIR, ("aaa", "bbb"))}
    with pytest.raises(mixed.MixedSettingsError, match=r"config_digest: 'aaa' \(single-fp32\) vs 'bbb'"):
        mixed.check(records, allow_mixed=False)


# ---------------------------------------------------------------- all or nothing
def test_staged_outputs_change_nothing_on_an_error_and_everything_on_success(tmp_path):
    root = tmp_path / "reports"
    (root / "metrics").mkdir(parents=True)
    (root / "metrics" / "a.json").write_text("old a")
    (root / "answer").mkdir()
    (root / "answer" / "gone.json").write_text("a variant no longer in the study")
    with pytest.raises(RuntimeError), outputs.staged(root, whole=("answer",)) as staging:
        (staging / "metrics").mkdir()
        (staging / "metrics" / "a.json").write_text("new a")
        raise RuntimeError("refused on the second variant")
    assert (root / "metrics" / "a.json").read_text() == "old a"
    assert sorted(p.name for p in root.iterdir()) == ["answer", "metrics"]  # no staging folder left
    with outputs.staged(root, whole=("answer",)) as staging:
        (staging / "metrics").mkdir()
        (staging / "metrics" / "b.json").write_text("new b")
        (staging / "answer").mkdir()
        (staging / "answer" / "kept.json").write_text("new")
        assert (root / "metrics" / "a.json").read_text() == "old a"  # nothing moves before the end
    assert sorted(p.name for p in (root / "metrics").iterdir()) == ["a.json", "b.json"]  # merged
    assert [p.name for p in (root / "answer").iterdir()] == ["kept.json"]  # replaced whole
    assert sorted(p.name for p in root.iterdir()) == ["answer", "metrics"]


def test_a_killed_stages_staging_folder_is_removed_by_the_next(tmp_path):
    dead = tmp_path / f"{outputs.PREFIX}999999999"
    dead.mkdir(parents=True)
    live = tmp_path / f"{outputs.PREFIX}{os.getppid()}"
    live.mkdir()
    with outputs.staged(tmp_path):
        pass
    assert not dead.exists() and live.exists()


def _model_file(project: Path, variant: str, run_id: str):
    from ampbench import config
    from ampbench.checkpoints.state import ModelFile
    from ampbench.training.model import AlexNet

    cfg = config.load_config(project / "params.yaml")
    return ModelFile(
        state_dict=AlexNet(cfg.model, 10).state_dict(),
        config=dataclasses.asdict(cfg),
        variant=variant,
        seed=0,
        run_id=run_id,
        variant_run_id=None,
        config_digest=cfg.digest(),
        classes=list(CLASSES),
        result=SeedResult.from_dict(dict.fromkeys(CARRIED)),  # nothing measured
        history=[{"epoch": 1}],
        pending_metrics=None,
    )


def test_evaluate_refused_on_its_second_variant_leaves_the_old_reports(project, monkeypatch):
    from ampbench import config
    from ampbench.stages import evaluate_main
    from ampbench.stages.evaluate import ModelFileError
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    run_id = Tracker("cifar10-amp").start("single-fp32/seed-0", {"ampbench.kind": "seed"})
    for folder in PAIR:  # the second folder holds the first variant's model: refused
        path = project / "models" / folder / "seed-0" / "model.pt"
        path.parent.mkdir(parents=True)
        _model_file(project, "single-fp32", run_id).save(path)
    _write_metrics(project, {"single-fp32": {"old": True}})
    cfg = config.load_config("params.yaml")
    args = argparse.Namespace(
        parallel=None, precision=None, variants=",".join(PAIR), params="params.yaml", allow_mixed=False
    )
    with pytest.raises(ModelFileError, match="single-autocast"):
        evaluate_main.main(cfg, args, [])
    reports = project / "reports"
    assert json.loads((reports / "metrics" / "single-fp32.json").read_text()) == {"old": True}
    assert not (reports / "plots").exists()
    assert sorted(p.name for p in reports.iterdir()) == ["metrics"]


# ---------------------------------------------------------------- the compare command
@pytest.mark.slow  # `python -m ampbench compare`: MLflow's imports, a store
def test_compare_refuses_mixed_settings_in_one_line_and_labels_them_when_allowed(project):
    odd = _odd()
    _write_metrics(project, odd)
    args = ("compare", "--variants", ",".join(PAIR))
    proc = run_cli(project, *args, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "train.epochs: 2 (single-fp32) vs 5 (single-autocast)" in errors[0], errors
    assert not (project / "reports" / "comparison.md").exists()
    run_cli(project, *args, "--allow-mixed")
    assert "MIXED SETTINGS" in (project / "reports" / "comparison.md").read_text()
    # and in what `dvc metrics show` / `dvc exp show` print (hostile pass: only the table said so)
    for variant in PAIR:
        assert json.loads((project / "reports" / "answer" / f"{variant}.json").read_text())["Mixed"] is True
    assert json.loads((project / "reports" / "summary.json").read_text())["mixed_settings"] is True
    run_cli(project, "compare", "--variants", PAIR[0])  # one variant: one configuration, no label
    assert "Mixed" not in json.loads((project / "reports" / "answer" / f"{PAIR[0]}.json").read_text())


@pytest.mark.slow  # `python -m ampbench compare`: MLflow's imports, a store
def test_compare_prints_its_table_under_an_ascii_output_encoding(project):
    _write_metrics(project, {v: _record(v) for v in PAIR})
    args = ("compare", "--variants", ",".join(PAIR), "--debug")  # the table: at DEBUG, on stderr
    proc = run_cli(project, *args, env=venv_env(PYTHONIOENCODING="ascii"))
    # stderr escapes what ASCII lacks (Python's backslashreplace): ± as \xb1, and nothing fails
    assert "| single-autocast | 2 | 0 | 0.5050 \\xb1 0.0071 |" in proc.stderr, proc.stderr[-3000:]
    answers = ("Answer: the fastest, ", "Answer: no variant trains faster")  # the terminal's answer
    assert any(a in proc.stdout for a in answers), proc.stdout
    staged = [p.name for p in (project / "reports").iterdir() if p.name.startswith(".")]
    assert staged == [] and (project / "reports" / "answer" / "single-fp32.json").exists()


@pytest.mark.parametrize(
    ("section", "key", "odd"), [("train", "epochs", 5), ("train", "lr", 0.3), ("model", "fc_dim", 48)]
)
def test_evaluate_refuses_models_trained_with_different_settings(project, monkeypatch, section, key, odd):
    """A variant retrained with `train.epochs: 5` beside one of 2 epochs (or another train.lr, a
    setting the metrics files do not carry: the hostile re-run got only two digests): refused
    before any run or report is touched, naming the setting and the variants."""
    from ampbench import config
    from ampbench.stages import evaluate_main

    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    for variant in PAIR:
        model = _model_file(project, variant, run_id="r-" + variant)
        usual = model.config[section][key]
        if variant == "single-autocast":
            model.config[section][key] = odd
            model.config_digest = "other"
        path = project / "models" / variant / "seed-0" / "model.pt"
        path.parent.mkdir(parents=True)
        model.save(path)
    cfg = config.replace(config.load_config("params.yaml"), train={"seeds": (0,)})
    args = argparse.Namespace(
        parallel=None, precision=None, variants=",".join(PAIR), params="params.yaml", allow_mixed=False
    )
    store = project / "mlflow.db"
    before = store.read_bytes() if store.exists() else None
    said = re.escape(
        f"different settings ({section}.{key}: {usual} (single-fp32) vs {odd} (single-autocast)),"
    )
    with pytest.raises(mixed.MixedSettingsError, match=said):
        evaluate_main.main(cfg, args, [])
    assert not (project / "reports").exists()
    assert (store.read_bytes() if store.exists() else None) == before  # the store untouched


@pytest.mark.slow  # a stage as a subprocess
def test_a_non_ascii_project_folder_under_the_c_locale_is_one_line(tmp_path):
    """Hostile re-run: a project at `/tmp/é ü` with LANG=C failed inside SQLAlchemy with "'utf-8'
    codec can't encode characters ...: surrogates not allowed", naming no folder and no fix."""
    project = new_project(tmp_path / "proj-é ü")
    env = venv_env(LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    proc = run_cli(project, "compare", env=env, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "proj-" in lines[0] and "cannot read: run with a UTF-8 locale" in lines[0], lines[0]
    utf8 = run_cli(project, "compare", env=venv_env(LC_ALL="C.UTF-8"), check=False)
    assert "cannot read: run with a UTF-8 locale" not in utf8.stderr, utf8.stderr


def test_a_full_disk_under_a_writer_that_names_no_file_names_the_reports_folder(tmp_path):
    """Hostile re-run: compare on a full reports/ said "could not write a file" (PIL's PNG writer
    names none)."""
    import errno

    from ampbench.tracking import faults

    with pytest.raises(OSError) as err, outputs.staged(tmp_path / "reports"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert faults.disk_full(err.value).startswith(
        f"No space left on device: could not write {tmp_path / 'reports'}/;"
    )


def test_compare_refuses_metrics_of_a_model_since_trained_again(project, monkeypatch):
    """Hostile re-run: a variant retrained with train.lr 0.1, evaluate refused (mixed settings),
    then `ampbench compare` ranked the old model's scores, exit 0. The metrics name the run they
    scored; the model file there now is another run's."""
    from ampbench.stages import compare

    records = {v: _record(v) for v in PAIR}  # seeds 0 and 1, runs "<variant>-<seed>"
    for seed in (0, 1):
        for variant in PAIR:
            path = project / "models" / variant / f"seed-{seed}" / "model.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            run_id = "retrained" if (variant, seed) == ("single-autocast", 1) else f"{variant}-{seed}"
            _model_file(project, variant, run_id).save(path)
    said = compare.replaced_since(records, project / "models")
    assert said.startswith(
        "reports/metrics/single-autocast.json scores a model since replaced "
        f"({project / 'models/single-autocast/seed-1/model.pt'} is now run retrained, the metrics are of "
        "run single-autocast-1): run `ampbench evaluate` first"
    ), said
    records["single-autocast"]["seeds"][1]["run_id"] = "retrained"
    assert compare.replaced_since(records, project / "models") == ""
    assert compare.replaced_since(records, project / "elsewhere") == ""  # no models here: the files speak
    # hostile pass R: a seed's model removed by hand (its variant's others there): ranked, exit 0
    gone = project / "models/single-autocast/seed-1/model.pt"
    gone.unlink()
    assert compare.replaced_since(records, project / "models") == (
        f"reports/metrics/single-autocast.json scores {gone}, gone since: `dvc repro` brings it back (from "
        "DVC's cache, else by training) and scores it again; or `ampbench train --parallel single "
        "--precision autocast`, then `ampbench evaluate`"
    )  # hostile pass Z: not "run `ampbench evaluate` first", which refuses for want of the model


def test_compare_refuses_metrics_whose_runs_the_store_does_not_hold(project, monkeypatch):
    """Hostile pass: with mlflow.db deleted after evaluate, compare wrote its reports, then said
    "failed (MlflowException: Run with id=... not found); check the store"."""
    from ampbench.stages.compare import runs_not_in
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    tracker = Tracker("cifar10-amp")
    held = tracker.start("single-fp32", {"ampbench.kind": "variant"})
    records = {"single-fp32": {"seeds": [{"seed": 0, "variant_run_id": held}]}}
    assert runs_not_in(tracker, records) == ""
    records["single-autocast"] = {"seeds": [{"seed": 0, "variant_run_id": "0" * 32}]}
    line = runs_not_in(tracker, records)
    named = f"reports/metrics/single-autocast.json names MLflow run {'0' * 32}, which store"
    assert line.startswith(named), line
    assert "MLFLOW_TRACKING_URI" in line and "\n" not in line


def test_runs_missing_from_the_repos_own_store_are_not_told_to_unset_a_variable(project, monkeypatch):
    """Hostile pass P: an emptied mlflow.db (`: > mlflow.db`) was told "point MLFLOW_TRACKING_URI at
    the store that holds the runs (unset it for the repo's mlflow.db)", with it unset already."""
    from ampbench.stages.compare import runs_not_in
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    monkeypatch.setenv("DVC_ROOT", str(project))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    line = runs_not_in(
        Tracker("cifar10-amp"), {"single-fp32": {"seeds": [{"seed": 0, "variant_run_id": "0" * 32}]}}
    )
    assert line.endswith(
        "does not hold: this is the repo's mlflow.db, replaced or emptied since: put back the one that "
        "holds them, or train and evaluate again"
    ), line
    assert "MLFLOW_TRACKING_URI" not in line


def test_compare_refuses_runs_of_another_experiment_than_tracking_experiment(project, monkeypatch):
    """Hostile pass P: tracking.experiment changed after training (or the experiment renamed in
    MLflow), compare printed, exit 0, a link to a new experiment holding only its own run."""
    from ampbench.stages.compare import runs_not_in
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    held = Tracker("cifar10-amp").start("single-fp32", {"ampbench.kind": "variant"})
    records = {"single-fp32": {"seeds": [{"seed": 0, "variant_run_id": held}]}}
    assert runs_not_in(Tracker("cifar10-amp"), records) == ""
    line = runs_not_in(Tracker("my-study"), records)
    assert line == (
        f"reports/metrics/single-fp32.json names MLflow run {held}, of experiment 'cifar10-amp', not of "
        "tracking.experiment 'my-study' (changed, or the experiment renamed, since it was trained): set "
        "tracking.experiment: cifar10-amp in params.yaml, or train and evaluate again"
    ), line


def test_the_printed_answer_of_a_mixed_comparison_is_labelled_and_not_called_a_demo():
    """Hostile pass: with --allow-mixed only comparison.md said so; the printed Answer line did
    not, and the mixed label made compare call the study "A demo on a subset"."""
    from ampbench.stages.compare import ending

    rows = [
        {"variant": "single-fp32", "speedup": 1.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
        {"variant": "single-autocast", "speedup": 3.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
    ]
    mixed_lines = ending(rows, subset=False, mixed=True)
    assert mixed_lines[0].startswith("Answer (MIXED SETTINGS, --allow-mixed: not one study): the fastest")
    assert not any("demo" in line for line in mixed_lines), mixed_lines
    assert ending(rows, subset=False)[0].startswith("Answer: the fastest, single-autocast")


def test_an_answer_where_the_baseline_is_fastest_does_not_compare_it_with_itself():
    from ampbench.stages.compare import ending

    rows = [
        {"variant": "single-fp32", "speedup": 1.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
        {"variant": "single-autocast", "speedup": 0.4, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
    ]
    said = ending(rows, subset=False)[0]
    assert said == "Answer: no variant trains faster than single-fp32 here; see the table.", said


def test_an_answer_of_one_variant_says_nothing_ranks_it():
    """Hostile pass H: `compare --variants single-fp32` answered "no variant trains faster than
    single-fp32 here", of a variant compared with no other."""
    from ampbench.stages.compare import ending

    rows = [{"variant": "single-fp32", "speedup": 1.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0}]
    said = ending(rows, subset=False)[0]
    assert said == "Answer: only single-fp32 was compared, so nothing ranks it; see the table.", said


def test_an_answer_that_rests_on_noisy_speeds_says_so_where_it_is_printed():
    """Hostile pass WARN: comparison.md flagged all nine variants as noisy ("re-run it on a quiet
    machine before quoting it"), and the printed answer, "the fastest ... trains at 2.53x", said
    nothing of it."""
    from ampbench.stages.compare import ending

    rows = [
        {"variant": "single-fp32", "speedup": 1.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
        {"variant": "single-autocast", "speedup": 3.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
        {"variant": "dp-fp32", "speedup": 0.9, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
    ]
    assert not any("noisy" in line for line in ending(rows, subset=False))  # steady: no caveat
    rows[2]["noisy"] = "noisy: epochs vary 40% (CV, seed 0)"  # not a row the answer compares
    assert not any("noisy" in line for line in ending(rows, subset=False))
    rows[0]["noisy"] = rows[1]["noisy"] = "noisy: seeds' images/s differ 30%"
    said = ending(rows, subset=False)
    assert said[1] == (
        "Not one to quote yet: single-autocast's and single-fp32's images/s are noisy (the self-check "
        "in comparison.md says why); re-run on a quiet machine."
    ), said
    rows[1]["speedup"] = 0.8  # hostile pass G: no variant faster than the baseline, which is noisy
    said = [line for line in ending(rows, subset=False) if "noisy" in line]
    assert said == [
        "Not one to quote yet: single-fp32's images/s is noisy (the self-check in comparison.md says "
        "why); re-run on a quiet machine."
    ], said


def test_models_trained_before_params_yaml_changed_are_said_to_be(tmp_path):
    """Hostile pass D: params.yaml edited (train.lr 0.2 -> 0.3) after the whole training; evaluate
    and compare then reported the models of 0.2 without a word that params.yaml says otherwise."""
    from ampbench import config

    cfg = config.load_config(REPO / "params.yaml")
    trained = {"train.lr": 0.2, "train.seeds": [0, 1, 2], "model.fc_dim": 4096}
    seeds = [{"config_digest": "before", mixed.SETTINGS: trained}]
    records = {v: {"seeds": seeds} for v in PAIR}
    now = {**trained, "train.lr": 0.3, "train.seeds": (0, 1, 2)}  # a tuple, as the config holds it
    said = mixed.since_trained(records, "after", now)
    assert said == (
        "these models were trained with other settings than params.yaml's (train.lr: 0.2 -> 0.3): the "
        "reports are of the models as trained; `make run` (or `dvc repro`) trains them again with params.yaml"
    ), said
    assert mixed.since_trained(records, "before", now) == ""  # the digest the models carry: nothing to say
    # hostile pass P: `evaluate --set train.lr=0.3` was told that params.yaml had changed
    assert mixed.since_trained(records, "after", now, ["train.lr=0.3"]) == (
        "the settings given (--set) differ from those these models were trained with (train.lr: 0.2 -> "
        "0.3): the reports are of the models as trained"
    )
    assert cfg.digest() and "train.lr" in cfg.digested()  # what evaluate passes


def test_a_deleted_run_or_experiment_is_named_as_deleted_with_the_restore(project, monkeypatch):
    """Hostile pass E: a variant run deleted in the UI was "a run the store does not hold (a new or
    replaced store?)"; a deleted experiment made every stage fail with MLflow's "must be in the
    'active' state" and "check the store", run after run."""
    from ampbench.stages.compare import runs_not_in
    from ampbench.tracking.store import TrackingError
    from ampbench.tracking.tracker import Tracker

    monkeypatch.chdir(project)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracker = Tracker("cifar10-amp")
    gone = tracker.start("single-fp32", {"ampbench.kind": "variant"})
    tracker.client.delete_run(gone)
    line = runs_not_in(tracker, {"single-fp32": {"seeds": [{"seed": 0, "variant_run_id": gone}]}})
    assert line == (
        f"reports/metrics/single-fp32.json names MLflow run {gone}, deleted in store {uri}: restore it "
        f"(`MLFLOW_TRACKING_URI={uri} mlflow runs restore --run-id {gone}`), or train and evaluate "
        "single-fp32 again"
    ), line
    experiment = tracker.experiment_id()
    tracker.client.delete_experiment(experiment)
    with pytest.raises(TrackingError) as err:
        Tracker("cifar10-amp").experiment_id()
    assert str(err.value) == (
        f"MLflow experiment 'cifar10-amp' of store {uri} is deleted (in its trash): restore it "
        f"(`MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {experiment}`), or name "
        "another experiment (tracking.experiment in params.yaml)"
    )


def test_a_queued_experiments_answer_names_no_path_in_dvcs_temporary_copy(tmp_path, monkeypatch):
    """Hostile pass Q: a queued experiment's compare printed "The table and chart:
    .dvc/tmp/exps/tmp9747mwnw/reports/comparison.md ... cd .dvc/tmp/exps/tmp9747mwnw && dvc metrics
    show", a folder DVC deletes as the experiment ends."""
    from ampbench.stages.compare import ending

    copy = tmp_path / "project" / ".dvc" / "tmp" / "exps" / "tmp9747mwnw"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "project"))
    monkeypatch.setenv("DVC_EXP_NAME", "qc")
    rows = [
        {"variant": "single-fp32", "speedup": 1.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
        {"variant": "single-autocast", "speedup": 3.0, "test_accuracy_mean": 0.8, "accuracy_delta": 0.0},
    ]
    assert ending(rows, subset=False)[-1] == (
        "The table and chart are in DVC's temporary copy of this experiment, which goes as it ends; its "
        "answer stays with it (dvc exp show): `dvc exp apply qc`, then `dvc repro`, writes them in the "
        "workspace"
    )


def test_variants_outside_the_matrix_are_named_with_the_training_that_fixes_them():
    """Hostile pass D8: single-tf32 trained with 3 epochs beside 2-epoch variants: evaluate's
    refusal said `dvc repro` "re-trains the variants trained otherwise", and single-tf32, in no stage
    of params.yaml's matrix, stayed as it was (the same refusal after two `dvc repro`)."""
    from ampbench.variants import study_variants

    assert "single-tf32" not in study_variants() and "single-fp32" in study_variants()  # the shipped matrix
    records = {
        v: {"seeds": [{"seed": 0, "train.epochs": e}]} for v, e in (("single-fp32", 2), ("single-tf32", 3))
    }
    with pytest.raises(mixed.MixedSettingsError) as err:
        mixed.check(records, allow_mixed=False)
    by_hand = (  # pass H10: then its metrics too
        " (single-tf32: in no stage of params.yaml's `variants`, so by hand: `ampbench train --parallel "
        "single --precision tf32`, then `ampbench evaluate --variants single-tf32`)"
    )
    assert f"re-trains the variants trained otherwise){by_hand}, or compare them anyway" in str(err.value)
    records["single-tf32"]["seeds"][0].update(config_digest="before", settings={"train.epochs": 3})
    said = mixed.since_trained({"single-tf32": records["single-tf32"]}, "after", {"train.epochs": 2})
    assert said.endswith(f"trains them again with params.yaml{by_hand}"), said
    assert mixed.by_hand({"single-fp32": {}}) == ""
