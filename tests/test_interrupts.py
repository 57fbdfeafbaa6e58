"""A Ctrl-C that a library swallows still stops the command (hostile re-run: Ctrl-C during the
download stage's `import torchvision` was caught inside the import; the stage went on extracting,
then failed 5 s later with a RecursionError traceback from the half-made numpy.linalg)."""

from __future__ import annotations

import contextlib
import os
import signal
import types

import pytest

from ampbench import cli, interrupts
from conftest import REPO


def _swallowing(then: BaseException | None):
    def main(cfg, args, argv) -> int:
        with contextlib.suppress(BaseException):  # what "a library" did with the Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
        if then is not None:
            raise then
        return 0

    return types.SimpleNamespace(main=main)


@pytest.mark.parametrize(
    "then", [None, RecursionError("maximum recursion depth exceeded")], ids=["ok", "broken"]
)
def test_a_swallowed_ctrl_c_ends_the_command_as_interrupted(then, monkeypatch, caplog):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(interrupts, "came", False)
    monkeypatch.setattr(cli, "command_module", lambda name: _swallowing(then))
    before = signal.getsignal(signal.SIGINT)
    try:
        code = cli.main(["download"])
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 130
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "interrupted (Ctrl-C): `ampbench download` stopped before it finished; run the same command again"
    ]


def test_a_loop_of_the_download_stops_at_its_next_item(monkeypatch):
    from ampbench.data import download_lines

    monkeypatch.setattr(interrupts, "came", True)
    with pytest.raises(KeyboardInterrupt):
        list(download_lines.counted([1, 2, 3], "extracting x", "files"))


def test_a_ctrl_c_while_held_waits_for_the_end_of_the_block():
    """torch's import and torch.save run Python from C++, where a KeyboardInterrupt aborted the
    download stage (hostile re-run: "terminate called after throwing ... error_already_set" from
    torch/autograd/__init__.py during `import torch`, 1 of 6 tries at 1.5 s). Held, it waits."""
    import time

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    got_through = False
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # where an unheld Ctrl-C would have raised
            got_through = True
    finally:
        signal.signal(signal.SIGINT, before)
    assert got_through


class _Finalized:
    def __del__(self):  # a Ctrl-C that lands in a finalizer: Python can only print it and go on
        raise KeyboardInterrupt


def test_a_ctrl_c_in_a_finalizer_prints_no_traceback_and_stops_a_measurement(capfd):
    """Final pass G: Ctrl-C early in bench or explain landed in a weakref or SQLAlchemy finalizer:
    "Exception ignored in: ... KeyboardInterrupt" and its traceback, then 35-54 s more measuring."""
    from ampbench.measuring import pace

    with interrupts.noted():
        _Finalized()  # collected at once: its __del__ raises
        assert interrupts.came
        with pytest.raises(KeyboardInterrupt):
            pace.between("a piece measured")  # the next boundary of a measurement
    assert "Exception ignored" not in capfd.readouterr().err
    with interrupts.noted():  # any other finalizer's error is printed as Python does
        type("Broken", (), {"__del__": lambda self: 1 / 0})()
    assert "ZeroDivisionError" in capfd.readouterr().err


def test_a_ctrl_c_during_a_save_is_delivered_after_the_rename(tmp_path, monkeypatch):
    """Final pass G: a second Ctrl-C during the stop checkpoint's save (a stop at once) was delivered
    between the write and the rename: the process ended, the checkpoint lost, its temp file left."""
    import torch

    from ampbench import atomic

    target, seen = tmp_path / "checkpoint.pt", []
    real_save = torch.save

    def save_then_ctrl_c(obj, f):
        real_save(obj, f)
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the file is written, not yet renamed

    monkeypatch.setattr(atomic.torch, "save", save_then_ctrl_c)
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(target.exists()))
    try:
        atomic.atomic_save({"step": 1}, target)
    finally:
        signal.signal(signal.SIGINT, before)
    assert seen == [True], "the Ctrl-C came before the checkpoint had its name"
    assert torch.load(target) == {"step": 1} and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM],
    ids=lambda sig: sig.name,
)
def test_sigterm_and_sighup_stop_a_command_with_its_line_and_status(sig, monkeypatch, caplog):
    """Hostile pass G: `ampbench evaluate` and `compare` died of SIGTERM or SIGHUP without a word
    (rc -15, -1), leaving a `compare` run RUNNING for good. Now they stop as Ctrl-C stops them,
    and an ignored one (nohup's SIGHUP) stays ignored. Pass Q: SIGQUIT, SIGUSR1/2 and SIGALRM
    killed download, estimate and compare without a line."""
    import time

    def main(cfg, args, argv) -> int:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal's handler raises in here
        return 0

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(cli, "command_module", lambda name: types.SimpleNamespace(main=main))
    before = signal.signal(sig, signal.SIG_DFL)
    try:
        code = cli.main(["compare"])
        assert signal.getsignal(sig) is signal.SIG_DFL  # put back after the command
        signal.signal(sig, signal.SIG_IGN)
        ignored = cli.main(["compare"])
    finally:
        signal.signal(sig, before)
    assert (code, ignored) == (128 + sig, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"interrupted ({sig.name}): `ampbench compare` stopped before it finished; run the same command again"
    ]
    caplog.clear()  # a stage of a plain `dvc repro` (hostile pass Y: "run the same command again")
    monkeypatch.setenv("DVC_STAGE", "compare")
    monkeypatch.delenv("AMPBENCH_RESUME_COMMAND", raising=False)
    before = signal.signal(sig, signal.SIG_DFL)
    try:
        assert cli.main(["compare"]) == 128 + sig
    finally:
        signal.signal(sig, before)
    assert "; run the pipeline command that started this stage again (`dvc repro`, " in caplog.text


def test_a_compare_run_stopped_while_it_publishes_ends_killed(tmp_path, monkeypatch):
    from ampbench.tracking import compare_runs
    from ampbench.tracking.tracker import Tracker
    from conftest import empty_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{empty_store(tmp_path / 'mlflow.db')}")
    tracker = Tracker("stopped")

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tracker, "publish_answer", stopped)
    with pytest.raises(KeyboardInterrupt):
        compare_runs.log_comparison(tracker, [], [], [], "")
    [run] = tracker.client.search_runs([tracker.experiment_id()])
    assert (run.info.run_name, run.info.status) == ("compare", "KILLED")


def test_a_ctrl_c_while_the_store_path_is_pinned_is_a_stop_line(monkeypatch, caplog):
    """Hostile pass V: Ctrl-C in the first 0.3 s of a command (`mlflow run`'s, with its relative
    sqlite MLFLOW_TRACKING_URI) came while SQLAlchemy loaded, before the command's stop handling:
    a 20-40 line KeyboardInterrupt traceback. Now it is the command's one stop line."""
    from ampbench.tracking import locations

    def pin() -> None:
        raise KeyboardInterrupt  # a Ctrl-C while SQLAlchemy loads

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(locations, "pin_tracking_uri", pin)
    monkeypatch.setattr(interrupts, "signum", 0)  # not a stop an earlier command in this process took
    assert cli.main(["compare"]) == 130
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "interrupted (Ctrl-C): `ampbench compare` stopped before it finished; run the same command again"
    ]


EARLY_CTRL_C = """
import os, signal, sys, time

class CtrlCWhileTheCommandLineLoads:  # a meta path finder: the keypress lands inside an import
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("CTRL_C_IN"):
            del os.environ["CTRL_C_IN"]  # once: not in what this process starts
            os.kill(os.getpid(), int(os.environ.get("EARLY_SIGNAL", signal.SIGINT)))
            time.sleep(2)
        return None

sys.meta_path.insert(0, CtrlCWhileTheCommandLineLoads())
del sys.modules["signal"]  # loaded above for the test's own use: the command's import is its first
"""


@pytest.mark.parametrize("module", ["signal", "ampbench.cli_options"])
@pytest.mark.parametrize("how", [["-m", "ampbench"], ["-c", "from ampbench.entry import run; run()"]])
def test_a_ctrl_c_while_the_command_line_loads_is_one_line(how, module, tmp_path):
    """Hostile pass V: a Ctrl-C in a command's first 0.1 s, while cli.py's own imports ran, was a
    KeyboardInterrupt traceback; pass W: also in the tens of ms `import signal` (its enum) took.
    `python -m ampbench` and the console script (entry.run) alike."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(EARLY_CTRL_C, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path), str(REPO / "src")])
    env = {**os.environ, "PYTHONPATH": path, "CTRL_C_IN": module}
    argv = [*how, "compare"] if how[0] == "-m" else [*how]
    proc = subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("interrupted (Ctrl-C): `ampbench ")
    assert "stopped before it started; run the same command again" in proc.stderr
    assert proc.returncode == 128 + signal.SIGINT


def test_a_ctrl_c_after_the_command_is_over_is_ignored(monkeypatch):
    """Hostile pass Y: Ctrl-C pressed again and again printed KeyboardInterrupt tracebacks from the
    exit's atexit callbacks after the command's last line."""
    import sys

    saved = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(interrupts, "last", False)  # cli.run sets it: put back for the next tests
    monkeypatch.setattr(sys, "argv", ["ampbench", "findings"])
    monkeypatch.setattr(cli, "main", lambda: 130)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # a light command: run() returns
    try:
        assert cli.run() == 130
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved)


def test_the_entry_run_is_ended_whole_though_ctrl_c_comes_again(monkeypatch):
    """Hostile pass Y: Ctrl-C pressed again while `ampbench variant` ended `mlflow run`'s run cut
    that short: the run stayed RUNNING for good."""
    import time

    from ampbench.commands import variant

    ended = []

    def end_it(change) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the store's answer, awaited
        ended.append(change)

    monkeypatch.setattr(variant, "_on_the_entry_run", end_it)
    with pytest.raises(KeyboardInterrupt):  # the Ctrl-C, once the run is ended
        variant._end_the_entry_run("KILLED")  # noqa: SLF001
    assert len(ended) == 1


def test_a_stage_under_dvc_refusing_its_settings_says_how_to_get_its_outputs_back(
    monkeypatch, caplog, tmp_path
):
    """Hostile pass Z: `dvc exp run -S train.epochs=abc`: DVC removed models/single-fp32 before the
    stage refused the value, and nothing said so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(
        (REPO / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    monkeypatch.setenv("DVC_STAGE", "train@single-fp32")
    # hostile pass Y: where dvc.lock records none (made outside DVC), no checkout can bring them back
    assert cli.main(["estimate", "--set", "train.epochs=abc"]) == cli.EXIT_USAGE
    none = "DVC removed this stage's outputs as it started (dvc.lock records none): its next run makes them"
    assert caplog.text.rstrip().endswith(none)
    caplog.clear()
    locked = "stages:\n  train@single-fp32:\n    outs:\n    - path: models/single-fp32\n      md5: ab.dir\n"
    (tmp_path / "dvc.lock").write_text(locked, encoding="utf-8")
    assert cli.main(["estimate", "--set", "train.epochs=abc"]) == cli.EXIT_USAGE
    fix = "DVC removed this stage's outputs as it started: `dvc checkout train@single-fp32` puts them back"
    assert caplog.text.rstrip().endswith(fix)
    monkeypatch.delenv("DVC_STAGE")
    caplog.clear()
    assert cli.main(["estimate", "--set", "train.epochs=abc"]) == cli.EXIT_USAGE
    assert "dvc checkout" not in caplog.text


def test_a_variant_run_says_which_pipeline_outputs_it_replaces(monkeypatch, caplog, tmp_path):
    """Hostile pass Z: a quick `mlflow run` after `dvc repro` replaced the study's models/single-fp32
    (and data/prepared) without a word, exit 0."""
    import logging

    from ampbench.commands import variant

    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.WARNING)
    cfg = types.SimpleNamespace()
    monkeypatch.setattr(
        variant, "prepared_mismatch", lambda cfg: ["data.url: prepared from 'a', configured 'b'"]
    )
    variant._say_what_is_replaced("single-fp32", cfg)  # noqa: SLF001 - no pipeline outputs: nothing said
    assert caplog.text == ""
    (tmp_path / "models" / "single-fp32" / "seed-0").mkdir(parents=True)
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "data" / "prepared" / "cifar10.pt").write_bytes(b"x")
    (tmp_path / "dvc.lock").write_text(
        "stages:\n  download:\n    outs:\n    - path: data/prepared\n  train@single-fp32:\n    outs:\n"
        "    - path: models/single-fp32\n",
        encoding="utf-8",
    )
    variant._say_what_is_replaced("single-fp32", cfg)  # noqa: SLF001
    assert "this run replaces the pipeline's models/single-fp32 and data/prepared" in caplog.text
    assert "`dvc checkout --force models/single-fp32 data/prepared` puts them back" in caplog.text
    # a variant whose name begins another's is not that one (pass G: single-autocast's run named
    # single-autocast_gradscaler's models as its own)
    caplog.clear()
    (tmp_path / "models" / "single-autocast").mkdir()
    (tmp_path / "dvc.lock").write_text(
        "stages:\n  train@single-autocast_gradscaler:\n    outs:\n"
        "    - path: models/single-autocast_gradscaler\n",
        encoding="utf-8",
    )
    variant._say_what_is_replaced("single-autocast", cfg)  # noqa: SLF001
    assert caplog.text == ""


def test_the_last_commands_end_takes_stops_without_dying_and_says_kept_work_once(monkeypatch, caplog):
    """Hostile pass G: a Ctrl-C between the command's end (noted put Python's handler back) and
    cli.run's ignore was a KeyboardInterrupt traceback; pass H: a SIGTERM there killed a train
    command whose every seed was kept, without a word. A command nested in it (`ampbench variant`'s
    train) leaves the handling to the outer one."""
    import logging
    import time

    stops = (signal.SIGINT, signal.SIGTERM)
    saved = {sig: signal.getsignal(sig) for sig in stops}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    monkeypatch.setattr(interrupts, "last", True)
    monkeypatch.setattr(interrupts, "_since", 0.0)
    caplog.set_level(logging.WARNING)
    try:
        with interrupts.noted():
            with interrupts.noted():  # the nested command's
                pass
            assert signal.getsignal(signal.SIGINT) is interrupts._on_sigint and interrupts.within  # noqa: SLF001
            interrupts.completed("came as `ampbench train` ended: its work is done and kept")
        assert not interrupts.within
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # a flood: neither raises nor kills
            os.kill(os.getpid(), sig)
            time.sleep(0.05)
        assert caplog.text.count("came as `ampbench train` ended: its work is done and kept") == 1
        assert "SIGINT came as `ampbench train` ended" in caplog.text
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_stop_a_nested_command_said_is_not_said_again_by_the_outer_one(monkeypatch, caplog):
    """Hostile pass H: SIGTERM in `ampbench variant`'s evaluate gave evaluate's "interrupted" line,
    then variant's own: the outer command's check saw the nested one's stop. Said once, with
    SIGTERM's name and status."""
    monkeypatch.delenv("AMPBENCH_RESUME_COMMAND", raising=False)
    stops = (signal.SIGINT, signal.SIGTERM)
    saved = {sig: signal.getsignal(sig) for sig in stops}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with interrupts.noted():
            with pytest.raises(KeyboardInterrupt), interrupts.noted():  # evaluate
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()
            assert cli._interrupted("evaluate") == 128 + signal.SIGTERM  # noqa: SLF001 - as cli.main does
            try:
                interrupts.check()  # variant: returns evaluate's 143, and says nothing more
            except KeyboardInterrupt:
                pytest.fail("the nested command's stop, said again by the outer one")
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert "interrupted (SIGTERM): `ampbench evaluate` stopped before it finished" in caplog.text


@pytest.mark.parametrize(
    ("pipeline", "resume"),
    [
        ({"AMPBENCH_RESUME_COMMAND": "make run"}, " To resume: make run"),
        # pass O: a plain `dvc repro` or `python -m ampbench.dvc_run repro`, which names none
        ({"DVC_STAGE": "compare"}, "; run the pipeline command that started it again"),
    ],
)
def test_a_ctrl_c_as_a_pipeline_stage_loads_names_the_pipelines_command(tmp_path, pipeline, resume):
    """Hostile pass J: Ctrl-C just as `make run` started a stage said "`ampbench train` stopped
    before it started; run the same command again": a command the user never typed."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(EARLY_CTRL_C, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path), str(REPO / "src")])
    env = {**os.environ, "PYTHONPATH": path, "CTRL_C_IN": "signal", **pipeline}
    if "DVC_STAGE" in pipeline:
        env.pop("AMPBENCH_RESUME_COMMAND", None)
    argv = [sys.executable, "-m", "ampbench", "compare"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    kept = "the stages that finished are kept" + ("." if resume.startswith(" ") else "")
    assert proc.stderr == (
        f"interrupted (Ctrl-C): `ampbench compare` stopped before it started; {kept}{resume}\n"
    ), proc.stderr
    assert proc.returncode == 128 + signal.SIGINT


def test_a_sigterm_while_variant_loads_is_one_line_and_ends_mlflow_runs_run(tmp_path):
    """Hostile pass M: a SIGTERM to `mlflow run`'s group 0.3 s in, under load, killed `ampbench
    variant` as it loaded: no line, and `mlflow run`'s run RUNNING for good."""
    import subprocess
    import sys
    import time

    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("entry"), tags={"mlflow.project.entryPoint": "main"})
    (tmp_path / "sitecustomize.py").write_text(EARLY_CTRL_C, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path), str(REPO / "src")])
    env = {**os.environ, "PYTHONPATH": path, "CTRL_C_IN": "signal", "EARLY_SIGNAL": str(int(signal.SIGTERM))}
    env.update(MLFLOW_TRACKING_URI=uri, MLFLOW_RUN_ID=run.info.run_id)
    env.pop("AMPBENCH_RESUME_COMMAND", None)
    argv = [sys.executable, "-m", "ampbench", "variant", "--parallel", "single", "--precision", "fp32"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stderr.startswith(
        "interrupted (SIGTERM): `ampbench variant` stopped before it started; run the same command again\n"
    ), proc.stderr
    assert proc.returncode == 128 + signal.SIGTERM
    deadline = time.monotonic() + 60  # ended by a child of its own, as the command exits at once
    while client.get_run(run.info.run_id).info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert client.get_run(run.info.run_id).info.status == "KILLED"
