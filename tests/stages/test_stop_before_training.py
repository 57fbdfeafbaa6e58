"""A stop that comes before the training loop is there (a model factory that never returns) stops
the stage at once; once the loop has asked, a stop waits for its step boundary (final pass I:
"stopping at the next step boundary", then 105 s of silence; a second Ctrl-C killed it without a
word)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from ampbench.stages.stop import StopFlag
from ampbench.training.stopping import Stopped


def test_a_stop_before_the_first_step_raises_at_once(handlers, monkeypatch, caplog):
    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    StopFlag()  # its handlers hold it
    with pytest.raises(Stopped, match="before the first training step"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the factory that never returns
    assert "SIGINT received before the first training step: stopping now" in caplog.text


def test_after_the_loop_asked_a_stop_waits_for_its_step_boundary(handlers, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    flag = StopFlag()
    assert flag() is False  # the loop's first question, after its first step
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # the handler ran: no exception, the flag is set
    assert flag() is True and flag.signum == signal.SIGINT


def test_a_ddp_worker_keeps_to_the_flag_from_the_start(handlers, monkeypatch):
    """Its peers must stop at the same step: a worker raising alone would leave them waiting."""
    monkeypatch.setenv("RANK", "1")
    flag = StopFlag()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert flag() is True


def test_a_stop_while_the_data_set_loads_is_a_stop_not_a_damaged_file(
    handlers, monkeypatch, tmp_path, caplog
):
    """CI, a warm stage Ctrl-C'd at its first instant: the Stopped raised inside torch.load was
    caught as a load failure, "data/prepared/cifar10.pt is unreadable (stopped before the first
    training step ...); delete it and re-download", exit 70 (and a user told to delete good data)."""
    import torch

    from ampbench.data import prepared

    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    path = tmp_path / "cifar10.pt"
    path.write_bytes(b"any")

    def load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # a large file read: the handler runs in here

    monkeypatch.setattr(torch, "load", load)
    StopFlag()
    with pytest.raises(Stopped, match="before the first training step"):
        prepared.load_dataset(path)


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM])
def test_ctrl_backslash_and_a_batch_systems_user_signals_stop_as_sigterm_does(sig, handlers, monkeypatch):
    """Hostile pass N: SIGUSR1 (SLURM's `--signal=USR1@60`, `timeout -s USR1`) and SIGQUIT (Ctrl-\\)
    ended training with no line, no stop checkpoint, its runs left RUNNING; pass Q: SIGALRM too."""
    monkeypatch.delenv("RANK", raising=False)
    flag = StopFlag()
    flag()  # the loop is there: a stop waits for its step boundary
    os.kill(os.getpid(), sig)
    assert flag() and flag.signum == sig


def test_an_inherited_ignore_of_sigint_is_kept(handlers, monkeypatch):
    """Hostile pass WARN: a script's background job (SIGINT ignored, as `cmd &` leaves it) dropped
    a Ctrl-C in its first second, then stopped on one once the stage had set its handler."""
    monkeypatch.delenv("RANK", raising=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    flag = StopFlag()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == flag._handle  # noqa: SLF001 - the one it set


def test_a_stop_before_the_first_step_names_an_earlier_checkpoint_kept(tmp_path):
    """Hostile pass WARN: "stopped before the first training step (nothing trained, nothing to save)
    in checkpoints/single-autocast/" while an earlier stop's checkpoint sat there (and was kept)."""
    from ampbench.stages import train_main

    before = Stopped("stopped before the first training step (nothing trained, nothing to save)")
    work = tmp_path / "single-fp32"
    assert train_main._where(before, work) == f"{before} in {work}/"  # noqa: SLF001
    (work / "seed-0").mkdir(parents=True)
    (work / "seed-0" / "checkpoint.pt").write_bytes(b"an earlier stop's")
    assert train_main._where(before, work) == (  # noqa: SLF001
        "stopped before its first training step (nothing trained since its last checkpoint); "
        f"the checkpoint in {work}/ is kept"
    )
    later = Stopped("stopped at seed 0 epoch 2 step 3; checkpoint saved")
    assert train_main._where(later, work) == f"{later} in {work}/"  # noqa: SLF001


@pytest.mark.slow
def test_a_stop_after_the_last_step_keeps_the_seeds_unpublished_and_the_rerun_trains_nothing(
    project, monkeypatch, caplog
):
    """Hostile pass Q: Ctrl-C right after the last seed's last step said "stopping at the next step
    boundary", then the stage published, exited 0, and DVC went on to the next stage, evaluate and
    compare (exit 0). Now the stage stops before publishing: the seeds wait in the work folder, and
    the same command publishes them without training again."""
    from ampbench.config import load_config
    from ampbench.paths import work_root
    from ampbench.stages import train

    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    cfg = load_config(project / "params.yaml")
    root, models = work_root(cfg.digest()), project / "models"
    done = root / "single-fp32" / "seed-0" / "model.pt"

    def args(stop):
        return (cfg, "single", "fp32", models, project / "data/prepared/cifar10.pt", False, stop, root)

    with pytest.raises(Stopped, match="stopped after the last training step, before publishing"):
        train.train_variant(*args(done.exists))  # the stop comes once the seed is done
    assert done.exists() and not (models / "single-fp32").exists()
    caplog.set_level(logging.INFO)
    (result,) = train.train_variant(*args(lambda: False))
    assert "already trained in this stage" in caplog.text
    assert (models / "single-fp32" / "seed-0" / "model.pt").exists() and not root.joinpath(
        "single-fp32"
    ).exists()


IMPORTED_SLOWLY = "ampbench_test_imported_slowly"


def test_a_stop_inside_an_import_waits_for_the_import_to_end(handlers, monkeypatch, tmp_path, caplog):
    """Hostile pass W: a stop before the first step raised inside importlib's module-lock callback,
    "Exception ignored", the import lock never let go, and the stage hung for good (runs RUNNING).
    A stop that comes inside the import system is raised once the import is over."""
    import sys

    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    (tmp_path / f"{IMPORTED_SLOWLY}.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\nDONE = True\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, IMPORTED_SLOWLY, raising=False)
    flag, imported = StopFlag(), []
    with pytest.raises(Stopped, match="before the first training step"):
        imported.append(__import__(IMPORTED_SLOWLY).DONE)  # the model factory's import, say
        time.sleep(5)  # then the stop comes at once
    flag.close()
    assert imported == [True]  # whole: the stop waited for it
    assert caplog.text.count("SIGINT received before the first training step") == 1


def test_a_stop_inside_a_finalizer_is_not_lost(handlers, monkeypatch, capfd):
    """A stop raised inside a finalizer is dropped by Python ("Exception ignored in ..."): it
    comes again, outside it."""
    import gc

    monkeypatch.delenv("RANK", raising=False)

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs in here

    flag = StopFlag()
    with pytest.raises(Stopped, match="before the first training step"):
        Finalized()
        gc.collect()
        time.sleep(5)
    flag.close()
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_ctrl_c_swallowed_before_the_stage_handles_stops_it_at_its_first_boundary(
    handlers, monkeypatch, caplog
):
    """Hostile pass Y: a Ctrl-C that a library swallowed (a finalizer) while the stage started was
    noted by the command, but the stage trained on to the end, deaf to it."""
    from ampbench import interrupts

    monkeypatch.delenv("RANK", raising=False)
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(interrupts, "within", True)
    monkeypatch.setattr(interrupts, "came", True)
    monkeypatch.setattr(interrupts, "signum", signal.SIGINT)
    flag = StopFlag()
    assert flag() is True and flag.signum == signal.SIGINT
    flag.close()
    assert "SIGINT received: stopping at the first step boundary" in caplog.text
    monkeypatch.setattr(interrupts, "within", False)  # an earlier command's: not this stage's
    assert StopFlag()() is False


def test_a_ctrl_c_pressed_again_and_again_is_one_stop(handlers, monkeypatch):
    """Hostile pass F: a flood of Ctrl-C 150 ms apart, while a stop took over a second, was taken
    for a second request 1 s after the first: stopped hard (-2), no stop line, runs RUNNING."""
    monkeypatch.delenv("RANK", raising=False)
    hard = []
    monkeypatch.setattr(signal, "raise_signal", hard.append)
    flag = StopFlag()
    flag()  # the loop is there
    for _ in range(8):  # 1.6 s of presses
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    assert flag() and hard == []
    assert signal.getsignal(signal.SIGINT) == flag._handle  # noqa: SLF001 - still the stop's
    time.sleep(1.1)  # a pause, then a second request: stop now, as documented
    os.kill(os.getpid(), signal.SIGINT)
    assert hard == [signal.SIGINT]


def test_a_stop_while_the_handlers_go_in_comes_once_they_are_in(handlers, monkeypatch):
    """Raised inside StopFlag() it reached no caller that takes it (a warm stage Ctrl-C'd at its
    first instant ended 143, SIGTERM's status, for a Ctrl-C): it comes again 50 ms later."""
    from ampbench.stages import stop

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(stop, "watch_launcher", lambda on_gone: os.kill(os.getpid(), signal.SIGINT))
    flag = StopFlag()
    with pytest.raises(Stopped, match="before the first training step"):
        time.sleep(5)
    assert flag.signum == signal.SIGINT


def test_the_jobs_own_sigterm_after_its_launchers_death_is_the_same_stop(handlers, monkeypatch):
    """Hostile pass J: a SIGTERM to `mlflow run`'s (or `dvc repro`'s) group; the stage saw its
    launcher die first, then its own SIGTERM reached the handler more than a second later (a long
    step): "SIGTERM again: stopping now", no checkpoint, its runs left RUNNING."""
    from ampbench.stages import stop

    raised = []
    monkeypatch.setattr(stop.signal, "raise_signal", raised.append)
    monkeypatch.setattr(stop, "watch_launcher", lambda on_gone: None)
    flag = StopFlag()
    assert flag() is False  # the loop is there
    flag._launcher_gone()  # noqa: SLF001 - what the launcher watch calls
    time.sleep(1.1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert flag() is True and not raised
    assert signal.getsignal(signal.SIGTERM) == flag._handle  # noqa: SLF001 - still the stage's
