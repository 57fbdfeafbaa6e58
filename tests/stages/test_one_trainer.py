"""One study, one truth in training: one trainer per variant (stages/train_lock.py), SIGHUP is a
stop like SIGTERM unless nohup ignored it (stages/stop.py), and a stage whose params.yaml changed
while it trained publishes nothing (stages/params_watch.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampbench.config import load_config
from ampbench.stages import train_lock
from ampbench.stages.params_watch import ParamsChangedError, ParamsWatch
from conftest import REPO, load_pt, long_project, run_cli, runs, wait_for_checkpoint, write_params

TRAIN = ("train", "--parallel", "single", "--precision", "fp32")
WORK = Path("checkpoints/single-fp32")
SEED0 = Path("models/single-fp32/seed-0/model.pt")


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


# ---------------------------------------------------------------- the lock itself
HOLD = """
import sys, time
from pathlib import Path
from ampbench.stages import train_lock
with train_lock.{how}:
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(cwd: Path, how: str) -> subprocess.Popen:
    """A process in cwd holding ``train_lock.<how>``, once it has said so."""
    code = HOLD.format(how=how)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_leaves_no_file(tmp_path):
    work = tmp_path / "checkpoints" / "single-fp32"
    first = _holder(tmp_path, "hold(Path('checkpoints/single-fp32'), 'single-fp32')")
    try:
        with pytest.raises(train_lock.TrainingBusyError) as err, train_lock.hold(work, "single-fp32"):
            pass
        assert str(err.value) == (
            f"single-fp32 is being trained by pid {first.pid}: wait for it or end it (kill {first.pid})"
        )
    finally:
        first.kill()
        first.wait()
    with train_lock.hold(work, "single-fp32"):  # the kernel dropped the dead holder's lock
        assert (work / train_lock.LOCK).read_text() == f"{os.getpid()}\n"
    assert not (tmp_path / "checkpoints").exists()  # nothing left where nothing was written


def test_a_dvc_stage_refused_a_second_trainer_names_what_brings_back_the_models_dvc_removed(
    tmp_path, monkeypatch
):
    """Hostile pass W: a plain `dvc repro` removes models/<v>/ before the stage's command refuses the
    second trainer (the pipeline command refuses first); the refusal says how to get them back."""
    monkeypatch.chdir(tmp_path)
    Path("dvc.lock").write_text("stages:\n  train@single-fp32:\n    outs:\n    - path: models/single-fp32\n")
    first = _holder(tmp_path, "hold(Path('checkpoints/single-fp32'), 'single-fp32')")
    try:
        monkeypatch.setenv("DVC_STAGE", "train@single-fp32")
        with pytest.raises(train_lock.TrainingBusyError) as err, train_lock.hold(WORK, "single-fp32"):
            pass
        assert str(err.value).endswith(
            ". DVC removed models/single-fp32/ as this stage began: until that training publishes its "
            "own, `dvc checkout models/single-fp32` brings back the one dvc.lock records"
        )
        Path("models/single-fp32").mkdir(parents=True)  # not removed: nothing to bring back
        with pytest.raises(train_lock.TrainingBusyError) as err, train_lock.hold(WORK, "single-fp32"):
            pass
        assert str(err.value).endswith(f"(kill {first.pid})")
    finally:
        first.kill()
        first.wait()


def test_new_data_is_not_made_while_a_variant_trains_from_the_old(tmp_path, monkeypatch):
    """Hostile pass I: a quick `mlflow run` (its download) re-prepared data/prepared while a train
    stage read it; that stage's models then met other data in evaluate."""
    from ampbench.config import ConfigError
    from ampbench.stages import download

    monkeypatch.chdir(tmp_path)
    download._refuse_while_trained()  # noqa: SLF001 - no trainer, no checkpoints/: nothing said
    first = _holder(tmp_path, "hold(Path('checkpoints/single-autocast'), 'single-autocast')")
    try:
        with pytest.raises(ConfigError) as err:
            download._refuse_while_trained()  # noqa: SLF001
        assert str(err.value) == (
            f"data/prepared is in use: single-autocast is being trained from it by pid {first.pid}, and "
            f"new data would change under it: wait for it or end it (kill {first.pid}), then run the "
            "same command again"
        )
        # the whole command: refused before anything is fetched, with its status
        (tmp_path / "params.yaml").write_bytes((REPO / "params.yaml").read_bytes())
        said = run_cli(tmp_path, "download", "--set", "data.url=file:///nowhere.tar.gz", check=False)
        assert said.returncode == 2 and "data/prepared is in use: single-autocast" in said.stderr, said.stderr
    finally:
        first.kill()
        first.wait()
    download._refuse_while_trained()  # noqa: SLF001 - its holder gone, the lock is no one's


def test_orphaned_ddp_workers_keep_a_new_launcher_out_until_they_end(tmp_path):
    work = tmp_path / "checkpoints" / "ddp-fp32"
    (work / "seed-0").mkdir(parents=True)  # a checkpoint in progress stays
    worker = _holder(work.parent, f"join(Path('ddp-fp32'), {os.getpid()})")  # its launcher: this process
    try:
        busy = pytest.raises(train_lock.TrainingBusyError, match=f"by pid {worker.pid}: .*kill {worker.pid}")
        with busy, train_lock.hold(work, "ddp-fp32"):
            pass
    finally:
        worker.kill()
        worker.wait()
    with train_lock.hold(work, "ddp-fp32"):
        pass
    assert sorted(p.name for p in work.iterdir()) == ["seed-0"]


def test_a_worker_whose_launcher_is_gone_trains_nothing(tmp_path):
    gone = pytest.raises(train_lock.TrainingBusyError, match="launcher .* is gone")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with gone, train_lock.join(tmp_path, launcher=dead.pid):
        pass


# ---------------------------------------------------------------- params.yaml under a stage
def test_params_watch_names_each_changed_setting_and_ignores_the_rest(tmp_path):
    params = tmp_path / "params.yaml"
    (tmp_path / "p").mkdir()
    write_params(tmp_path, train={"lr": 0.2})
    watch = ParamsWatch(load_config(params, ["train.epochs=3"]), str(params), ["train.epochs=3"])
    watch.check()
    write_params(tmp_path, train={"lr": 0.2, "checkpoint_every_s": 5})  # when it saves, not what it computes
    watch.check()
    write_params(tmp_path, train={"lr": 0.1, "epochs": 7}, model={"fc_dim": 16})
    with pytest.raises(ParamsChangedError) as err:
        watch.check()  # train.epochs stays 3: the stage's --set
    assert str(err.value) == (
        f"{params} changed while this stage ran (model.fc_dim 32 -> 16, train.lr 0.2 -> 0.1); its models "
        "were trained with the old settings and are not published. To publish them, put the old settings "
        "back and re-run: the finished seeds are not trained again. To train with the new ones, run the "
        "same command"
    )
    params.write_text("train: {lr: -1}\n")
    with pytest.raises(ParamsChangedError, match="it no longer loads"):
        watch.check()


@pytest.mark.slow
def test_a_stage_whose_params_changed_while_it_trained_publishes_nothing(tmp_path, procs):
    """Found after the seed it changed under: the next seed is not trained (hostile re-run: the
    whole stage trained first, then was thrown away)."""
    project = long_project(tmp_path / "p", epochs=8, seeds=[0, 1])
    proc = procs.start(project, *TRAIN)
    wait_for_checkpoint(proc, project / WORK / "seed-0" / "checkpoint.pt", project / "train.log")
    original = (project / "params.yaml").read_text()
    write_params(project, train={"epochs": 8, "lr": 0.1, "seeds": [0, 1]})
    assert proc.wait(240) == 1
    log = (project / "train.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    errors = _errors(log)
    assert (
        len(errors) == 1 and "params.yaml changed while this stage ran (train.lr 0.05 -> 0.1)" in errors[0]
    ), log
    assert not (project / SEED0).exists() and not (project / WORK / "seed-1").exists()
    assert [r.info.status for r in runs(project, kind="variant")] == ["FAILED"]
    (project / "params.yaml").write_text(original)  # the settings it trained with: published as is
    again = run_cli(project, *TRAIN)
    assert "already trained in this stage" in again.stderr and (project / SEED0).exists()


# ---------------------------------------------------------------- the train stage
@pytest.mark.slow
def test_a_second_train_of_the_same_variant_fails_at_once_in_one_line(tmp_path, procs):
    project = long_project(tmp_path / "p", epochs=40)
    first = procs.start(project, *TRAIN)
    wait_for_checkpoint(first, project / WORK / "seed-0" / "checkpoint.pt", project / "train.log")
    t0 = time.monotonic()
    second = run_cli(project, *TRAIN, check=False, timeout=120)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    said = f"single-fp32 is being trained by pid {first.pid}: wait for it or end it (kill {first.pid})"
    errors = _errors(second.stderr)
    assert len(errors) == 1 and errors[0].endswith(said), second.stderr
    assert time.monotonic() - t0 < 60
    assert len(runs(project, kind="seed")) == 1  # the second opened no run
    first.send_signal(signal.SIGTERM)
    assert first.wait(120) == 128 + signal.SIGTERM


@pytest.mark.slow
def test_sighup_stops_training_like_sigterm_with_a_checkpoint(tmp_path, procs):
    project = long_project(tmp_path / "p", epochs=40)
    proc = procs.start(project, *TRAIN)  # a session of its own, SIGHUP not ignored: a closed terminal
    wait_for_checkpoint(proc, project / WORK / "seed-0" / "checkpoint.pt", project / "train.log")
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(120) == 128 + signal.SIGHUP
    log = (project / "train.log").read_text()
    assert "SIGHUP received" in log and "To resume, run the same command again" in log, log[-3000:]
    assert "checkpoint saved" in log and load_pt(project / WORK / "seed-0" / "checkpoint.pt")["epoch"] >= 1
    assert [r.info.status for r in runs(project, kind="seed")] == ["KILLED"]
    assert not (project / WORK / train_lock.LOCK).exists()
