"""A checkpoint whose configuration digest matches but whose weights have other shapes (the
model's code changed since it was written) stops the resume in one line naming it and --fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampbench import config
from ampbench.checkpoints import files, work
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.training import loop, parallel, precision
from conftest import REPO, crash_at_step, make_dataset


def _job(folder: Path, fc_dim: int, stop=lambda: False) -> loop.Job:
    cfg = config.load_config(REPO / "params.yaml")
    train = {"epochs": 2, "batch_size": 20, "seeds": (0,), "lr": 0.05, "checkpoint_every_s": 0.0}
    cfg = config.replace(cfg, model={"fc_dim": fc_dim}, train=train)
    strategy = parallel.Single()
    strategy.setup()
    return loop.Job(
        cfg, precision.REGISTRY["fp32"], strategy, make_dataset(), 0, folder / "checkpoint.pt", stop
    )


def test_a_checkpoint_of_other_shapes_is_one_line_naming_it_and_fresh(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(_job(tmp_path, 32, crash_at_step(4)))  # epoch 1 saved, then a crash
    saved = SeedCheckpoint.load(tmp_path / "checkpoint.pt")
    with pytest.raises(files.CheckpointError) as err:
        loop.train_seed(_job(tmp_path, 48), resume=saved)  # the same settings, another model
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'checkpoint.pt'} does not fit this model (RuntimeError:")
    assert message.endswith("discard it with `ampbench train ... --fresh`")  # a stage names its variant
    assert "\n" not in message
    assert len(message) < 400


def test_fresh_discards_a_checkpoint_of_other_shapes_and_trains_from_the_start(tmp_path):
    """The line's fix must work (hostile re-run D9: `--fresh` gave the same error again, since the
    digest matched): --fresh discards any checkpoint, and the seed then trains from epoch 1."""
    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(_job(tmp_path, 32, crash_at_step(4)))
    ckpt = tmp_path / "checkpoint.pt"
    job = _job(tmp_path, 48)
    saved = SeedCheckpoint.load(ckpt)
    digest, variant = saved.config_digest, saved.variant
    assert work.load_resume(ckpt, digest, variant, False, job.strategy) is not None  # it matches
    assert work.load_resume(ckpt, digest, variant, True, job.strategy) is None  # --fresh
    assert not ckpt.exists()
    out = loop.train_seed(job)  # the new model's shapes, from the start
    assert len(out["history"]) == 2


def test_fresh_trains_a_finished_seed_again_and_its_resume_line_drops_it(tmp_path):
    final = tmp_path / "model.pt"
    final.write_bytes(b"a finished seed of the old model's code")  # not even read under --fresh
    assert work.finished(final, "single-fp32", "digest", fresh=True) is None
    hint = work.resume_hint(["train", "--parallel", "single", "--precision", "fp32", "--fresh"])
    assert hint.endswith(
        "ampbench train --parallel single --precision fp32 (or the dvc repro / make run that started it)"
    )


def test_a_stage_under_dvc_names_the_pipeline_to_resume_not_its_own_command(monkeypatch):
    """Hostile pass L: the stage's own `ampbench train ...` resumed the seeds but left dvc.lock
    stale, and the pipeline's next run trained the variant again from scratch."""
    monkeypatch.delenv("AMPBENCH_RESUME_COMMAND", raising=False)
    monkeypatch.setenv("DVC_STAGE", "train@single-fp32")
    hint = work.resume_hint(["train", "--parallel", "single", "--precision", "fp32"])
    assert hint.startswith("To resume, run the pipeline command that started this stage again (`dvc repro`")
    assert "ampbench train" not in hint


def test_an_optimizer_state_of_other_shapes_is_the_same_one_line(tmp_path):
    """Hostile re-run: a momentum buffer of another shape (the digest and the weights match) passed
    torch's load_state_dict and failed at the first step in a 70-line traceback."""
    import torch

    with pytest.raises(RuntimeError, match="crash"):
        loop.train_seed(_job(tmp_path, 32, crash_at_step(4)))
    ckpt = tmp_path / "checkpoint.pt"
    raw = torch.load(ckpt, weights_only=True)
    state = raw["optimizer"]["state"]
    state[max(state)]["momentum_buffer"] = torch.zeros(7, 5)
    torch.save(raw, ckpt)
    with pytest.raises(files.CheckpointError) as err:
        loop.train_seed(_job(tmp_path, 32), resume=SeedCheckpoint.load(ckpt))
    message = str(err.value)
    assert message.startswith(
        f"{ckpt} does not fit this model (RuntimeError: size mismatch for the optimizer's"
    )
    assert message.endswith("discard it with `ampbench train ... --fresh`")  # a stage names its variant
    assert "\n" not in message
