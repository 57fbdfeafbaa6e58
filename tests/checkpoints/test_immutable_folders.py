"""A folder with the immutable attribute (`chattr +i`) refuses new files even to root and to its
owner: the fix is `chattr -i`, not `sudo chown` (hostile pass WARN: a models/ folder made immutable
got "give it back (`sudo chown -R $USER models/single-fp32`)", which changes nothing)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ampbench import paths
from ampbench.checkpoints import files, work


@pytest.fixture
def immutable(tmp_path: Path):
    """A function that makes a folder immutable; each is made mutable again afterwards."""
    made: list[Path] = []

    def make(folder: Path) -> Path:
        if shutil.which("chattr") is None:
            pytest.skip("needs chattr (e2fsprogs) to set the immutable attribute")
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"this file system or user cannot set the immutable attribute: {done.stderr.strip()}")
        made.append(folder)
        return folder

    yield make
    for folder in made:
        subprocess.run(["chattr", "-i", str(folder)], check=False)


def test_an_immutable_folder_is_named_with_chattr(tmp_path, immutable):
    (tmp_path / "models").mkdir()
    folder = immutable(tmp_path / "models")
    reason = paths.unwritable(folder)
    assert reason is not None
    assert "may be immutable or append-only" in reason and f"`sudo chattr -i -a {folder}`" in reason


def test_an_immutable_seed_folder_in_models_gets_chattr_not_chown(tmp_path, immutable, monkeypatch):
    seed = tmp_path / "models" / "single-fp32" / "seed-0"
    seed.mkdir(parents=True)
    (seed / "model.pt").write_bytes(b"an earlier model")
    immutable(seed)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(files.CheckpointError) as err:
        work.check_replaceable(Path("models/single-fp32"))
    line = str(err.value)
    assert "cannot be replaced by this stage's models: models/single-fp32/seed-0 (" in line, line
    assert "`sudo chattr -i -a models/single-fp32/seed-0`" in line and "chown" not in line, line
    assert "rm -r" not in line, line  # an immutable folder cannot be removed either (hostile pass D)
