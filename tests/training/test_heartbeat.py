"""Where no bar is drawn (output not a terminal), a train stage says where it is every
``heartbeat.HEARTBEAT_S`` seconds: a CPU stage in a log file is never silent for long."""

from __future__ import annotations

import re
import time
from pathlib import Path

from test_progress import _cfg

from ampbench.training import heartbeat, progress

LINE = re.compile(r"single-fp32: seed (\d+), epoch (\d+)/4, step (\d+)/10: (\d+)% of this stage done(.*)")


def _stage(tmp_path: Path, enabled: bool = True) -> progress.StageProgress:
    return progress.StageProgress(
        _cfg(seeds=(0, 1), eval_each_epoch=False), "single-fp32", 10, 20, "cpu", enabled=enabled,
        warmup_steps=2, min_timed_s=0.0, min_timed_steps=3, models_dir=tmp_path / "models",
        work_dir=tmp_path / "work", params_file=tmp_path / "params.yaml",
    )  # fmt: skip


def _run(stage: progress.StageProgress, steps: int, pause: float, caplog) -> list[str]:
    """`steps` steps of seed 0 (`pause` s each), reporting as the loop does; the lines logged."""
    stage.start_seed(0)
    with caplog.at_level("INFO", logger="ampbench.training.progress"):
        for _ in range(steps):
            time.sleep(pause)
            if stage.step():
                stage.report()
            if stage.step_in_epoch == stage.spe:
                stage.epoch_done()
    stage.close()
    return [r.getMessage() for r in caplog.records]


def test_a_stage_without_a_bar_says_where_it_is_every_heartbeat(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 0.2)
    stage = _stage(tmp_path)
    assert stage.bar is not None and stage.bar.disable  # pytest captures the output: no terminal
    stage.heartbeat.last = time.perf_counter()  # the test process is old: count from here
    lines = [m for m in map(LINE.fullmatch, _run(stage, 14, 0.05, caplog)) if m]
    # 14 steps of 0.05 s: 0.7 s, so two or three lines (the estimate line resets the wait)
    assert 2 <= len(lines) <= 4, [m.group(0) for m in lines]
    last = lines[-1]
    done = 10 * (int(last[2]) - 1) + int(last[3])  # steps of seed 0 when it was said
    assert int(last[4]) == round(100 * done / 80)  # of 2 seeds x 4 epochs x 10 steps
    assert "left" in last[5]  # the step time was measured by then: the time left is said too


def test_no_heartbeat_before_its_time_or_on_other_ranks(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 60.0)
    stage = _stage(tmp_path)
    stage.heartbeat.last = time.perf_counter()
    assert not [m for m in map(LINE.fullmatch, _run(stage, 14, 0.0, caplog)) if m]
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 0.0)
    quiet = _stage(tmp_path, enabled=False)  # rank > 0
    assert not quiet.heartbeat.on
    assert not [m for m in map(LINE.fullmatch, _run(quiet, 5, 0.0, caplog)) if m]


def test_a_bar_on_a_terminal_replaces_the_heartbeat(tmp_path: Path, monkeypatch):
    """Where tqdm draws its bar (a terminal), the bar is the progress: no heartbeat lines."""
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "__init__", _drawn(tqdm.tqdm.__init__))
    stage = _stage(tmp_path)
    assert not stage.bar.disable and not stage.heartbeat.on
    stage.close()


def _drawn(init):
    def wrapped(self, *args, **kwargs):
        kwargs["disable"] = False  # as on a terminal
        init(self, *args, **kwargs)

    return wrapped
