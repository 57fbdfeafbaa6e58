"""models/ and checkpoints/ that cannot take files stop the train stage before it trains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ampbench.checkpoints import files, work
from conftest import run_cli, runs, small_tmpfs


def test_a_file_in_a_folders_place_is_named(tmp_path):
    (tmp_path / "models").write_text("not a folder")
    with pytest.raises(files.CheckpointError) as err:
        work.check_writable(tmp_path / "checkpoints" / "single-fp32", tmp_path / "models" / "single-fp32")
    message = str(err.value)
    models = tmp_path / "models"
    assert f"{models}/ cannot hold the trained models ({models} is a file)" in message
    assert "then re-run" in message and "\n" not in message


def test_writable_folders_pass_and_create_nothing(tmp_path):
    """A refused stage must leave no models/ behind (other faults' tests check that), so the probe
    goes into the nearest folder that exists and is removed."""
    work.check_writable(tmp_path / "checkpoints" / "v", tmp_path / "models" / "v")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "models").mkdir()
    work.check_writable(tmp_path / "checkpoints" / "v", tmp_path / "models" / "v")
    assert [p.name for p in tmp_path.iterdir()] == ["models"] and not list((tmp_path / "models").iterdir())


@pytest.mark.slow  # a train stage as a subprocess
def test_the_train_stage_refuses_before_creating_a_run(project: Path):
    (project / "models").write_text("not a folder")
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "models/ cannot hold the trained models" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert runs(project) == []  # refused before MLflow was touched


def test_a_file_in_place_of_the_variants_models_folder_is_named(tmp_path):
    """Issue #36: models/<variant> a file was a NotADirectoryError after the whole training."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "v").write_text("not a folder")
    out = tmp_path / "models" / "v"
    with pytest.raises(files.CheckpointError) as err:
        work.check_writable(tmp_path / "checkpoints" / "v", out)
    assert f"{out} is a file, not a folder" in str(err.value) and f"`rm {out}`" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_locks_folder_in_a_files_place_is_the_same_one_line(tmp_path):
    """The lock is taken before the stage's check: a file at checkpoints/ was a 25-line
    NotADirectoryError traceback from the lock's mkdir (issue #36)."""
    from ampbench.stages import train_lock

    (tmp_path / "checkpoints").write_text("not a folder")
    with pytest.raises(files.CheckpointError) as err, train_lock.hold(tmp_path / "checkpoints" / "v", "v"):
        pass
    folder = tmp_path / "checkpoints" / "v"
    assert f"{folder}/ cannot hold the work in progress (checkpoints)" in str(err.value)
    assert f"{tmp_path / 'checkpoints'} is a file" in str(err.value)


def test_a_failed_publish_is_one_line_and_leaves_no_staging_folder(tmp_path):
    """models/ changed after the stage's check (a race): the publish fails in one line, its
    staging folder goes, and the finished models wait in the work folder for a re-run."""
    done = tmp_path / "checkpoints" / "v"
    (done / "seed-0").mkdir(parents=True)
    (done / "seed-0" / "model.pt").write_bytes(b"weights")
    out = tmp_path / "models" / "v"
    out.parent.mkdir()
    out.write_text("appeared meanwhile")
    with pytest.raises(files.CheckpointError) as err:
        work.publish(done, out, [0])
    assert f"could not publish the trained models into {out}" in str(err.value)
    assert f"the models wait in {done}/" in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in out.parent.iterdir()) == ["v"]  # no .v.publishing
    assert (done / "seed-0" / "model.pt").read_bytes() == b"weights"


@pytest.mark.slow  # a train stage as a subprocess
@pytest.mark.parametrize("in_the_way", ["checkpoints", "checkpoints/single-fp32", "models/single-fp32"])
def test_a_file_in_a_work_or_models_folders_place_stops_train_in_one_line(project: Path, in_the_way):
    """Each was a traceback (issue #36): the first two from the lock, the last after training."""
    (project / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (project / in_the_way).write_text("not a folder")
    proc = run_cli(project, "train", "--parallel", "single", "--precision", "fp32", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"{in_the_way} is a file" in errors[0], proc.stderr
    assert runs(project) == []  # refused before MLflow was touched
    assert not any(p.name.endswith(".publishing") for p in project.rglob("*"))


def test_a_publish_onto_a_full_filesystem_says_no_space_and_keeps_the_models(tmp_path):
    """models/ on a small filesystem of its own (checkpoints/ elsewhere): the models are copied,
    not linked, and the copy fills the disk. The line says no space, where, and that the models
    wait in the work folder (not "make it writable", which would not help)."""
    done = tmp_path / "checkpoints" / "v"
    (done / "seed-0").mkdir(parents=True)
    (done / "seed-0" / "model.pt").write_bytes(os.urandom(2 * 2**20))
    with small_tmpfs(tmp_path / "models", "1m") as models:
        out = models / "v"
        with pytest.raises(files.CheckpointError) as err:
            work.publish(done, out, [0])
        text = str(err.value)
        assert text.startswith(f"No space left on device: could not copy the trained models into {out}"), text
        assert f"the models wait in {done}/" in text and "chown" not in text and "\n" not in text
        assert os.listdir(models) == []  # no staging folder left
    assert (done / "seed-0" / "model.pt").stat().st_size == 2 * 2**20


def test_a_read_only_mount_is_fixed_by_mounting_it_writable_not_by_rm(tmp_path, monkeypatch):
    """Hostile pass B7: a read-only bind mount of models/single-autocast was told "make it writable by
    this user or remove it (`sudo rm -r ...`)", which a read-only filesystem refuses too."""
    from ampbench import paths

    out = tmp_path / "models" / "single-autocast"
    (out / "seed-0").mkdir(parents=True)
    monkeypatch.setattr(work, "unreplaceable", lambda folder: (folder, paths.READ_ONLY))
    with pytest.raises(files.CheckpointError) as err:
        work.check_replaceable(out)
    said = str(err.value)
    assert f"({paths.READ_ONLY}): mount its filesystem writable (`findmnt -T {out}` names the mount)" in said
    assert "rm -r" not in said and "chown" not in said
    line = paths.cannot_hold(tmp_path / "models", "trained models", paths.READ_ONLY)
    assert line.endswith(
        f"mount its filesystem writable (`findmnt -T {tmp_path / 'models'}` names the mount), then re-run"
    )


def test_a_mount_point_in_the_models_place_is_refused_before_training(tmp_path, monkeypatch):
    """Hostile pass C8: models/single-autocast bind-mounted: "mount its filesystem writable", then,
    remounted writable, the whole training, then "could not publish ... (Device or resource busy)":
    no rename replaces a mount point, and neither chown nor rm -r removes it."""
    from ampbench import paths

    out = tmp_path / "models" / "single autocast"  # a space: the table writes it \\040
    (out / "seed-0").mkdir(parents=True)
    # pass E9: a bind mount of a folder of the same filesystem, which os.path.ismount misses
    table = tmp_path / "mountinfo"
    point = os.path.realpath(out).replace(" ", "\\040")
    table.write_text(f"36 35 98:0 /bm {point} rw,noatime master:1 - ext4 /dev/vda rw\n", encoding="utf-8")
    monkeypatch.setattr(paths, "MOUNTINFO", table)
    assert not os.path.ismount(out) and paths.mount_point(out)
    with pytest.raises(files.CheckpointError) as err:
        work.check_replaceable(out)
    assert str(err.value) == (
        f"{out} is a mount point, which this stage cannot replace (it renames the new models into its "
        f"place): unmount it (`umount {out}`), or mount {out.parent}/ instead, then re-run "
        "(nothing was trained)"
    )
    work.check_replaceable(out.parent / "single-fp32")  # not there: nothing to replace


def test_a_publish_keeps_the_models_of_seeds_it_did_not_train(tmp_path):
    """Hostile pass F9: `ampbench train ... --set 'train.seeds=[5]'` (the fix evaluate named for a
    missing seed 5) published seed-5 alone: the finished seed-0 and seed-1 models were gone."""
    done = tmp_path / "checkpoints" / "v"
    for seed in (1, 5):
        (done / f"seed-{seed}").mkdir(parents=True)
        (done / f"seed-{seed}" / "model.pt").write_bytes(b"new %d" % seed)
    out = tmp_path / "models" / "v"
    for seed in (0, 1):
        (out / f"seed-{seed}").mkdir(parents=True)
        (out / f"seed-{seed}" / "model.pt").write_bytes(b"old %d" % seed)
    work.publish(done, out, [1, 5])
    found = {p.parent.name: p.read_bytes() for p in out.glob("seed-*/model.pt")}
    assert found == {"seed-0": b"old 0", "seed-1": b"new 1", "seed-5": b"new 5"}
    assert not done.exists() and sorted(p.name for p in out.parent.iterdir()) == ["v"]
