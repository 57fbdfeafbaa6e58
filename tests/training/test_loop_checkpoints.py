"""The training loop's checkpoints (train.checkpoint_every_s): when it saves, that timed saves
change no weight and a crash resumes exactly, and that a failed write stops training.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ampbench import config
from ampbench.checkpoints import files
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.training import loop, parallel, precision
from conftest import REPO, assert_same_weights, crash_at_step, make_dataset


def _seed_job(tmp_path: Path, stop=lambda: False, **train) -> loop.Job:
    """One fp32 seed in this process (no MLflow): 60 images, batch 20, 3 steps per epoch, 3 epochs."""
    cfg = config.load_config(REPO / "params.yaml")
    train = {"epochs": 3, "batch_size": 20, "seeds": (0,), "lr": 0.05, **train}
    cfg = config.replace(cfg, model={"fc_dim": 32}, train=train)
    strategy = parallel.Single()
    strategy.setup()
    ckpt = tmp_path / "checkpoint.pt"
    return loop.Job(cfg, precision.REGISTRY["fp32"], strategy, make_dataset(), 0, ckpt, stop)


def test_checkpoint_every_s_zero_saves_every_epoch_end_and_the_default_none_in_a_short_seed(tmp_path):
    out = loop.train_seed(_seed_job(tmp_path, checkpoint_every_s=0.0))
    assert out["result"].checkpoints_written == 2  # epochs 1 and 2: the last one is model.pt's
    assert out["result"].checkpoint_seconds > 0
    saved = SeedCheckpoint.load(tmp_path / "checkpoint.pt")
    assert (saved.epoch, saved.step, saved.stats, len(saved.history)) == (2, 0, None, 2)
    (tmp_path / "checkpoint.pt").unlink()
    default = config.load_config(REPO / "params.yaml").train.checkpoint_every_s
    assert default == 60  # a seed that trains in seconds (an H200's) writes none
    out = loop.train_seed(_seed_job(tmp_path, checkpoint_every_s=default))
    assert out["result"].checkpoints_written == 0 and not (tmp_path / "checkpoint.pt").exists()


def test_timed_saves_mid_epoch_change_nothing_and_a_crash_resumes_exactly(tmp_path, one_thread):
    """checkpoint_every_s: 1e-9 saves at every step boundary; a crash resumes from the last one."""
    reference = loop.train_seed(_seed_job(tmp_path / "reference", checkpoint_every_s=1e9))
    timed = loop.train_seed(_seed_job(tmp_path / "timed", checkpoint_every_s=1e-9))
    assert timed["result"].checkpoints_written == 3 * 2 + 2  # steps 1-2 of each epoch, 2 ends
    assert_same_weights(timed["state_dict"], reference["state_dict"])

    with pytest.raises(RuntimeError, match="crash"):
        # crash at epoch 2's 2nd step, after a save at its 1st
        loop.train_seed(_seed_job(tmp_path / "crashed", crash_at_step(5), checkpoint_every_s=1e-9))
    saved = SeedCheckpoint.load(tmp_path / "crashed" / "checkpoint.pt")
    assert (saved.epoch, saved.step, len(saved.history)) == (1, 1, 1) and saved.stats is not None
    resumed = loop.train_seed(_seed_job(tmp_path / "crashed", checkpoint_every_s=1e9), resume=saved)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    assert_same_weights(resumed["state_dict"], reference["state_dict"])


def test_a_failed_checkpoint_write_raises_in_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    job = _seed_job(tmp_path, checkpoint_every_s=0.0)
    job.checkpoint_path = blocker / "checkpoint.pt"
    with pytest.raises(files.CheckpointError, match="could not write checkpoint"):
        loop.train_seed(job)


class _Progress:
    """A stage's progress that has a line to say after every step."""

    def __init__(self) -> None:
        self.steps = self.reports = self.epoch_reports = 0

    def start_seed(self, *args) -> None:
        pass

    def step(self, device) -> bool:
        self.steps += 1
        return True

    def report(self) -> None:
        self.reports += 1

    def epoch_done(self, device, say: bool = True) -> None:
        self.epoch_reports += say


def test_no_estimate_line_between_a_stop_notice_and_the_stop(tmp_path):
    """Hostile pass WARN: "SIGINT received: stopping at the next step boundary", then an estimate
    of the time left, then the stop's own line."""
    progress = _Progress()
    job = _seed_job(tmp_path, lambda: progress.steps >= 2)  # the signal came during the 2nd step
    job.progress = progress
    with pytest.raises(loop.Stopped, match="stopped at seed 0 epoch 1 step 2"):
        loop.train_seed(job)
    assert progress.reports == 1  # after step 1 only


def test_no_epoch_end_estimate_after_a_stop_that_came_during_the_evaluation(tmp_path):
    """Hostile pass I: "SIGTERM received", then "single-fp32, after its first epoch ...: this
    stage needs about ...", then the stop's line: the signal came after the epoch's last stop
    check, while the epoch was evaluated and saved."""
    progress, asked = _Progress(), []

    def stop() -> bool:  # 3 steps, 2 checks each: the 7th call is the first after epoch 1's last
        asked.append(1)
        return len(asked) > 6

    job = _seed_job(tmp_path, stop)
    job.progress = progress
    with pytest.raises(loop.Stopped, match="stopped at seed 0 epoch 2 step 1"):
        loop.train_seed(job)
    assert progress.epoch_reports == 0


def test_a_resume_is_said_by_the_main_process_only(tmp_path, caplog):
    """Hostile pass C: a DDP stage's "resuming seed 1 at epoch 2 step 12" once per worker."""
    import logging

    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(_seed_job(tmp_path, crash_at_step(2), checkpoint_every_s=1e-9))
    saved = SeedCheckpoint.load(tmp_path / "checkpoint.pt")
    caplog.set_level(logging.INFO)
    job = _seed_job(tmp_path, crash_at_step(1))  # resumed, then stopped at once: the line is said first

    class Worker(parallel.Single):  # a DDP worker of rank 1, as far as the loop's lines go
        is_main = False

    job.strategy.__class__ = Worker
    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(job, resume=saved)
    assert not [r for r in caplog.records if "resuming seed" in r.getMessage() and r.levelno >= logging.INFO]


def test_a_stopped_seed_the_list_no_longer_holds_is_refused_not_dropped(tmp_path):
    """Hostile pass N: stopped in seed 1 of [0, 1], then `--set 'train.seeds=[0]'`: exit 0, and the
    publish removed seed 1's checkpoint without a word."""
    from ampbench.checkpoints import work

    job = _seed_job(tmp_path, crash_at_step(2), checkpoint_every_s=1e-9)
    job.checkpoint_path = tmp_path / "single-fp32" / "seed-1" / "checkpoint.pt"
    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(job)
    assert job.checkpoint_path.exists()
    with pytest.raises(work.ResumeError, match=r"seed-1/checkpoint.pt was written by .* Resuming would mix"):
        work.refuse_foreign(tmp_path / "single-fp32", [0], "another", "single-fp32", fresh=False)
    work.refuse_foreign(tmp_path / "single-fp32", [0], "another", "single-fp32", fresh=True)  # discarded
