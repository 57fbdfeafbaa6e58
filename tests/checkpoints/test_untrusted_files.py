"""Checkpoint and model files that are not what they claim: pickles that would run code, other
formats, kinds and versions, missing fields. Each is refused with the fix; nothing is unpickled.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from ampbench.checkpoints import files
from ampbench.checkpoints.state import ModelFile, SeedCheckpoint
from ampbench.seed_result import CARRIED, SeedResult
from ampbench.training import parallel
from conftest import SEED0, run_cli


class _Payload:
    """Unpickling this would create a folder: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.mark.parametrize("kind", ["object", "function"])
def test_checkpoint_that_is_not_plain_weights_is_rejected(project, tmp_path, kind):
    marker = tmp_path / "code-ran"
    model_pt = _unsafe_model_pt(project, marker, kind)
    with pytest.raises(files.CheckpointError, match="not a readable plain-weights checkpoint"):
        files.load(model_pt)
    assert not marker.exists()


def test_a_damaged_checkpoint_is_one_short_line_not_torchs_paragraph(tmp_path):
    """Hostile pass WARN: torch's whole first line ("... internal miniz error. If you are seeing
    this, ... file an issue") inside the checkpoint's one line."""

    class Damaged(RuntimeError):
        pass

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"x")
    miniz = "PytorchStreamReader failed reading file data/0: internal miniz error. If you are seeing this"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files.torch, "load", lambda *a, **k: (_ for _ in ()).throw(Damaged(miniz + " ...")))
        with pytest.raises(files.CheckpointError) as err:
            files.load(path)
    assert str(err.value) == (
        f"{path} is not a readable plain-weights checkpoint (Damaged: PytorchStreamReader failed reading "
        "file data/0: internal miniz error.); delete it and re-run training"
    )


def test_files_of_another_format_or_kind_or_lacking_fields_are_refused_with_the_fix(tmp_path):
    ckpt = tmp_path / "checkpoints" / "single-fp32" / "seed-0" / "checkpoint.pt"
    files.save({"epoch": 1, "run_id": "x", "config_digest": "d"}, ckpt)  # an older version's dict
    with pytest.raises(files.CheckpointError) as err:
        SeedCheckpoint.load(ckpt)
    message = str(err.value)
    assert str(ckpt) in message and "older ampbench (checkpoint format 1" in message and "--fresh" in message

    model_pt = ckpt.with_name("model.pt")
    nothing = SeedResult.from_dict(dict.fromkeys(CARRIED))
    model = ModelFile({}, {}, "single-fp32", 0, "r", "v", "d", [], nothing, [], None)
    model.save(model_pt)
    assert ModelFile.load(model_pt) == model
    assert model.matches("d", "single-fp32") and not model.matches("d", "single-autocast")
    with pytest.raises(files.CheckpointError, match="is a 'model' file, not a checkpoint file"):
        SeedCheckpoint.load(model_pt)
    raw = files.load(model_pt)
    del raw["history"]
    files.save(raw, model_pt)
    fix = "re-train: `ampbench train --parallel single --precision fp32`"
    with pytest.raises(files.CheckpointError, match=f"lacks history .*{re.escape(fix)}"):
        ModelFile.load(model_pt)
    files.save({**raw, "format": ModelFile.FORMAT + 1}, model_pt)
    with pytest.raises(files.CheckpointError, match="written by a newer ampbench"):
        ModelFile.load(model_pt)


def test_fresh_discards_a_checkpoint_that_cannot_be_resumed(tmp_path):
    """Without --fresh an old-format checkpoint stops the stage (its message says --fresh); with it,
    the checkpoint is discarded and the seed starts over."""
    from ampbench.checkpoints import work

    ckpt = tmp_path / "checkpoint.pt"
    files.save({"epoch": 1, "run_id": "x", "config_digest": "d", "variant": "single-fp32"}, ckpt)
    with pytest.raises(files.CheckpointError, match="--fresh"):
        work.load_resume(ckpt, "d", "single-fp32", False, parallel.Single())
    assert ckpt.exists()
    assert work.load_resume(ckpt, "d", "single-fp32", True, parallel.Single()) is None
    assert not ckpt.exists()


@pytest.mark.slow
def test_evaluate_stage_refuses_a_model_that_is_not_plain_weights(project, tmp_path):
    """The evaluate stage goes through the same files.load: one end-to-end run is enough."""
    marker = tmp_path / "code-ran"
    _unsafe_model_pt(project, marker, "object")
    proc = run_cli(project, "evaluate", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 1
    assert "not a readable plain-weights checkpoint" in proc.stderr and str(SEED0 / "model.pt") in proc.stderr
    assert not marker.exists()


def _unsafe_model_pt(project: Path, marker: Path, kind: str) -> Path:
    """A model.pt whose unpickling would run code (an object's __reduce__, or a function)."""
    model_pt = project / SEED0 / "model.pt"
    model_pt.parent.mkdir(parents=True)
    payload = _Payload(marker) if kind == "object" else os.getcwd
    torch.save({"state_dict": payload, "config": {}, "classes": [], "run_id": "x"}, model_pt)
    return model_pt
