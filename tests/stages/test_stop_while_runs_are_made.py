"""A stop that comes while a train stage makes its MLflow runs waits until the run is named in
the work folder (variant.json, seed-<s>/run.json), then stops the stage with that run KILLED
(hostile pass V: Ctrl-C of `mlflow run` between the variant run's making and variant.json left
the run RUNNING for good, and the re-run started another beside it)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ampbench import cli
from ampbench.tracking.tracker import Tracker
from conftest import WORK0, runs


@pytest.mark.slow  # a train stage in this process (stopped before its first step)
@pytest.mark.parametrize("making", ["variant_run", "log_dataset"])  # the variant's run, a seed's
def test_a_stop_while_a_run_is_made_ends_it_killed_and_names_it(making, project, monkeypatch, handlers):
    made = getattr(Tracker, making)

    def stopped_meanwhile(self, *args, **kwargs):
        answer = made(self, *args, **kwargs)  # the run exists; its id is not yet in the work folder
        os.kill(os.getpid(), signal.SIGINT)
        return answer

    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    monkeypatch.setattr(Tracker, making, stopped_meanwhile)
    assert cli.main(["train", "--parallel", "single", "--precision", "fp32"]) == 128 + signal.SIGINT
    made_runs = runs(project)
    assert made_runs and {r.info.status for r in made_runs} == {"KILLED"}  # none left RUNNING
    (variant,) = runs(project, kind="variant")
    work = project / WORK0.parent
    assert json.loads((work / "variant.json").read_text(encoding="utf-8"))["run_id"] == variant.info.run_id
    for seed in runs(project, kind="seed"):  # the re-run continues it, not another beside it
        assert json.loads((project / WORK0 / "run.json").read_text(encoding="utf-8"))["run_id"] == (
            seed.info.run_id
        )


@pytest.mark.slow  # a train stage of two seeds in this process
def test_a_stop_after_a_seeds_last_step_makes_no_run_for_the_next(project, monkeypatch, handlers, caplog):
    """Hostile pass F: a stop after seed 0's last step went on to make seed 1's run and set it up
    (over a second on a loaded machine) before the stage stopped at seed 1's first step."""
    from ampbench.tracking import train_runs

    closed = train_runs.close_seed_run

    def stopped_after(*args, **kwargs):
        closed(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    monkeypatch.setattr(train_runs, "close_seed_run", stopped_after)
    argv = ["train", "--parallel", "single", "--precision", "fp32", "--set", "train.seeds=[0, 1]"]
    assert cli.main(argv) == 128 + signal.SIGINT
    assert "stopped after seed 0, before seed 1: the seeds trained are kept" in caplog.text
    assert [r.data.tags["seed"] for r in runs(project, kind="seed")] == ["0"]
    assert [r.info.status for r in runs(project, kind="variant")] == ["KILLED"]


@pytest.mark.slow  # a train stage in this process
def test_a_stop_flood_after_the_last_seed_is_said_once_and_ends_nothing(
    project, monkeypatch, handlers, caplog
):
    """Hostile pass G: Ctrl-C pressed again and again just after the last seed's line (its models
    published, the stage's own handlers gone) said "stopped before it finished; run the same command
    again", exit 130: the re-run would train every seed again. Now: said once, exit 0."""
    from ampbench.stages import stop

    closed = stop.StopFlag.close

    def flood_after(self, completed: bool = False) -> None:
        closed(self, completed)
        for _ in range(3) if completed else ():
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    monkeypatch.setattr(stop.StopFlag, "close", flood_after)
    assert cli.main(["train", "--parallel", "single", "--precision", "fp32"]) == 0
    assert caplog.text.count("SIGINT came after training's last step: every seed is trained and kept") == 1
    assert "stopped before it finished" not in caplog.text
    assert (project / "models/single-fp32").is_dir()
    assert [r.info.status for r in runs(project, kind="variant")] == ["FINISHED"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the next command's Ctrl-C stops it


@pytest.mark.slow  # a train stage in this process (stopped before its first step)
def test_a_stop_in_the_stages_set_up_before_its_loop_is_its_own_stop(project, monkeypatch, handlers, caplog):
    """A warm stage Ctrl-C'd at its first instant: the stop came in torchrun's @record set-up,
    outside the stage's own stop handling, and ended 143 (SIGTERM's status) with cli's line."""
    from ampbench.stages import launch

    recorded = launch.record

    def stopped_meanwhile(run):
        os.kill(os.getpid(), signal.SIGINT)
        return recorded(run)

    monkeypatch.chdir(project)
    monkeypatch.setenv("AMPBENCH_WARM", "0")
    monkeypatch.setattr(launch, "record", stopped_meanwhile)
    assert cli.main(["train", "--parallel", "single", "--precision", "fp32"]) == 128 + signal.SIGINT
    assert "stopped before the first training step (nothing trained, nothing to save) in " in caplog.text
    assert "To resume" in caplog.text
