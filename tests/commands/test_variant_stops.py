"""`ampbench variant` stopped mid-training says to run `ampbench variant` again (hostile pass G:
its stop line named the inner `ampbench train ...`, which trains but never evaluates)."""

from __future__ import annotations

import os
import signal

import pytest

from ampbench import cli, interrupts
from ampbench.commands import variant
from ampbench.config import load_config
from conftest import REPO


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_stopped_variant_names_itself_to_resume_and_evaluates_nothing(sig, monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("AMPBENCH_RESUME_COMMAND", "AMPBENCH_SCOPE", "MLFLOW_RUN_ID"):  # what main sets
        monkeypatch.setenv(name, "")  # so that the undo removes what main sets
        monkeypatch.delenv(name)
    monkeypatch.setattr(variant, "launcher_command", lambda: None)  # not under `mlflow run`
    monkeypatch.setattr(variant, "prepared_mismatch", lambda cfg: "")
    monkeypatch.setattr(variant, "DATA_FILE", REPO / "params.yaml")  # "prepared": nothing to download
    seen = []

    def stage(argv: list[str]) -> int:
        seen.append((argv[0], os.environ.get("AMPBENCH_RESUME_COMMAND")))
        return 128 + sig  # the train stage, stopped

    monkeypatch.setattr(cli, "main", stage)
    argv = ["variant", "--parallel", "single", "--precision", "autocast", "--fc-dim", "48"]
    args = cli._parser().parse_args(argv)  # noqa: SLF001
    assert variant.main(load_config(REPO / "params.yaml"), args, argv) == 128 + sig
    said = "ampbench variant --parallel single --precision autocast --fc-dim 48"
    assert seen == [("train", said)]  # what its stop line says; no evaluate after a stop


def _variant_in_the_repo(monkeypatch) -> None:
    """`ampbench variant` run in the repo by hand (no `mlflow run`), its data taken as prepared."""
    monkeypatch.chdir(REPO)
    for name in ("AMPBENCH_RESUME_COMMAND", "AMPBENCH_SCOPE", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(variant, "launcher_command", lambda: None)
    monkeypatch.setattr(variant, "prepared_mismatch", lambda cfg: "")
    monkeypatch.setattr(variant, "DATA_FILE", REPO / "params.yaml")
    monkeypatch.setattr(interrupts, "late", 0)
    monkeypatch.setattr(interrupts, "signum", 0)  # no stop yet: a Ctrl-C is what the line then says


def test_a_stop_after_trainings_last_step_stops_the_variant_before_its_evaluation(monkeypatch, caplog):
    """Hostile pass O: Ctrl-C just after the last step said "stopping at the next step boundary",
    then the variant evaluated, printed its whole answer, and only then died of the signal (-2).
    The train stage now puts the handlers back and says the signal came late; the variant stops
    there with the command that evaluates the trained seeds."""
    from ampbench.stages import stop

    _variant_in_the_repo(monkeypatch)
    monkeypatch.setattr(interrupts, "_told", False)
    monkeypatch.setattr(stop, "watch_launcher", lambda on_gone: None)
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def stage(argv: list[str]) -> int:  # the train stage: its last step, then a Ctrl-C, then done
        seen.append(argv[0])
        flag = stop.StopFlag()
        flag()
        os.kill(os.getpid(), signal.SIGINT)
        flag.close(completed=True)
        assert signal.getsignal(signal.SIGINT) is before  # a later Ctrl-C is the command's again
        return 0

    monkeypatch.setattr(cli, "main", stage)
    argv = ["variant", "--parallel", "single", "--precision", "autocast"]
    args = cli._parser().parse_args(argv)  # noqa: SLF001
    assert variant.main(load_config(REPO / "params.yaml"), args, argv) == 128 + signal.SIGINT
    assert seen == ["train"]  # no evaluate
    assert "SIGINT came after training's last step: every seed is trained and kept" in caplog.text
    assert (
        "stopped before the evaluation; to evaluate the trained seeds: ampbench evaluate --parallel single"
        in (caplog.text)
    )


def test_the_entry_run_is_named_in_the_store_mlflow_run_records_it_in(tmp_path, monkeypatch):
    """Hostile pass T: `cd /tmp/x; MLFLOW_TRACKING_URI=sqlite:///k.db mlflow run <project>`: the
    variant named (and on a stop ended) `mlflow run`'s own run through MLflow's reading of the
    relative path, from the project: its run kept MLflow's name, or stayed RUNNING, and an empty
    k.db appeared in the project."""
    import subprocess

    from mlflow.tracking import MlflowClient

    from ampbench.tracking import locations
    from conftest import empty_store

    started, project = tmp_path / "x", tmp_path / "project"
    project.mkdir()
    started.mkdir()
    empty_store(started / "k.db")
    client = MlflowClient(f"sqlite:///{started / 'k.db'}")
    entry = client.create_run(client.create_experiment("e"), tags={"mlflow.project.entryPoint": "main"})
    mlflow_run = subprocess.Popen(["sleep", "60"], cwd=started)  # stands for `mlflow run`
    try:
        monkeypatch.setattr(locations, "setter_of", lambda variable: mlflow_run.pid)
        monkeypatch.chdir(project)
        monkeypatch.setenv("DVC_ROOT", str(project))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///k.db")
        monkeypatch.setenv("MLFLOW_RUN_ID", entry.info.run_id)
        variant._name_the_entry_run("single-fp32")
        variant._end_the_entry_run("KILLED")
    finally:
        mlflow_run.kill()
    run = client.get_run(entry.info.run_id)
    assert (run.info.run_name, run.info.status) == ("single-fp32 (mlflow run)", "KILLED")
    assert not (project / "k.db").exists()


def test_a_stop_in_the_variants_evaluation_names_the_evaluation_not_the_training(monkeypatch, caplog):
    """Hostile pass H: Ctrl-C in `ampbench variant`'s evaluate said "To resume: ampbench variant
    ...", which trained every seed again; the evaluation alone is what is left."""
    _variant_in_the_repo(monkeypatch)
    ended = []
    monkeypatch.setattr(variant, "_end_the_entry_run", ended.append)

    def stage(argv: list[str]) -> int:  # train completes; evaluate is interrupted as cli.main says it
        return cli._interrupted(argv[0]) if argv[0] == "evaluate" else 0  # noqa: SLF001

    monkeypatch.setattr(cli, "main", stage)
    argv = ["variant", "--parallel", "single", "--precision", "autocast"]
    args = cli._parser().parse_args(argv)  # noqa: SLF001
    assert variant.main(load_config(REPO / "params.yaml"), args, argv) == 128 + signal.SIGINT
    said = "`ampbench evaluate` stopped before it finished; the stages that finished are kept. To resume: "
    assert said in caplog.text
    assert "To resume: ampbench evaluate --parallel single --precision autocast --params params.yaml" in (
        caplog.text
    )
    assert ended == ["KILLED"]  # `mlflow run`'s own run too


def test_a_stop_before_the_variants_stages_ends_mlflow_runs_run_killed(monkeypatch, caplog):
    """Hostile pass K: a SIGTERM to `mlflow run`'s group 0.3-1.5 s in, while `ampbench variant`
    still started: its line said "run the same command again", and `mlflow run`'s run stayed
    RUNNING for good under MLflow's random name."""
    _variant_in_the_repo(monkeypatch)
    monkeypatch.setenv("MLFLOW_RUN_ID", "0123456789abcdef")
    ended = []
    monkeypatch.setattr(variant, "_end_the_entry_run", ended.append)
    monkeypatch.setattr(variant, "launcher_command", lambda: "mlflow run . -P parallel=single")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # as a stop in the command's start-up is

    monkeypatch.setattr(cli, "load_config", stopped)
    assert cli.main(["variant", "--parallel", "single", "--precision", "fp32"]) == 128 + signal.SIGINT
    assert ended == ["KILLED"]
    assert "stopped before it finished; the stages that finished are kept. To resume: mlflow run . -P " in (
        caplog.text
    )


def test_a_stop_that_broke_mlflows_import_ends_the_run_from_a_fresh_interpreter(tmp_path, monkeypatch):
    """Hostile pass K, checked by hand: the SIGTERM landed inside `import mlflow`; ending the run
    then failed on the half-made module ("partially initialized module 'mlflow'"), a traceback."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("entry"), tags={"mlflow.project.entryPoint": "main"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)

    def half_imported(status: str) -> None:
        raise AttributeError("partially initialized module 'mlflow' has no attribute 'version'")

    monkeypatch.setattr(variant, "_end_the_entry_run", half_imported)
    monkeypatch.setattr(variant, "launcher_command", lambda: None)
    assert variant.stopped_outside_its_stages() is None
    assert client.get_run(run.info.run_id).info.status == "KILLED"
