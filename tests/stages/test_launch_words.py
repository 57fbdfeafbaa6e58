"""What the DDP launcher says when its workers were stopped (stages/launch.py): what is on disk,
not a promise. A hostile pass pressed Ctrl-C 2 s into a DDP stage: the workers were still starting,
saved nothing, and the launcher said "every DDP worker saved a checkpoint"."""

from __future__ import annotations

from pathlib import Path

from ampbench.stages import launch

HINT = "To resume, run the same command."


def test_a_stop_before_the_first_checkpoint_says_nothing_was_saved(tmp_path: Path):
    work = tmp_path / "checkpoints" / "ddp-fp32"
    said = launch._what_was_saved(work, HINT)  # the folder does not even exist yet
    assert "nothing was saved" in said and "saved their work" not in said, said
    (work / "seed-0").mkdir(parents=True)  # a seed folder (run.json only) is no checkpoint
    (work / "seed-0" / "run.json").write_text("{}")
    assert "nothing was saved" in launch._what_was_saved(work, HINT)


def test_a_stop_after_a_checkpoint_names_where_it_is(tmp_path: Path):
    work = tmp_path / "checkpoints" / "ddp-fp32"
    (work / "seed-1").mkdir(parents=True)
    (work / "seed-1" / "checkpoint.pt").write_bytes(b"x")
    said = launch._what_was_saved(work, HINT)
    assert f"saved their work in {work}/" in said and said.endswith(HINT), said
