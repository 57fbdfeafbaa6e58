"""What a stage writes is refused before its work when it cannot be written, and a failure names
the output, never the staging folder that is gone by the time the user reads the line (hostile
pass, 2026-12-06: evaluate ran 44 s, then named `reports/.staging-<pid>/...` with a `sudo chown`
of that gone path)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ampbench import cli, outputs
from ampbench.stages import train_lock
from ampbench.tracking import faults


def test_a_folder_in_a_reports_files_place_is_refused_before_the_work(tmp_path):
    root = tmp_path / "reports"
    (root / "metrics" / "a.json").mkdir(parents=True)  # a folder where the report goes
    worked = []
    with pytest.raises(outputs.OutputsError) as err, outputs.staged(root):
        worked.append(True)
    assert not worked, "the stage's work ran before the refusal"
    assert str(err.value) == (
        f"{root / 'metrics' / 'a.json'} is a folder where a report file goes: remove it "
        f"(`rm -r {root / 'metrics' / 'a.json'}`), then re-run"
    )


@pytest.mark.parametrize("in_the_way", ["metrics", "plots", "plots/curves"])
def test_a_file_in_a_report_folders_place_is_refused_before_the_work(tmp_path, in_the_way):
    """Final pass H: reports/metrics as a file: evaluate scored every variant, then a traceback
    (FileExistsError) at the move."""
    from ampbench.stages.evaluate import FOLDERS

    root = tmp_path / "reports"
    (root / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (root / in_the_way).write_text("x", encoding="utf-8")
    worked = []
    with pytest.raises(outputs.OutputsError) as err, outputs.staged(root, folders=FOLDERS):
        worked.append(True)
    assert not worked, "the stage's work ran before the refusal"
    assert str(err.value).startswith(f"{root / in_the_way} is a file where a folder of reports goes: move it")


def test_a_reports_link_to_nothing_is_refused_before_the_work(tmp_path):
    """Final pass L: `reports` a link to a folder that is gone: a FileExistsError traceback."""
    root = tmp_path / "reports"
    root.symlink_to(tmp_path / "gone")
    with pytest.raises(outputs.OutputsError) as err, outputs.staged(root):
        pass
    assert str(err.value).startswith(f"{root} is a link to {tmp_path / 'gone'}, which does not exist")


def test_a_move_that_fails_names_the_report_not_the_staging_folder(tmp_path):
    root = tmp_path / "reports"
    (root / "metrics" / "a").mkdir(parents=True)  # in the file's place, unsuffixed: found at the move
    with pytest.raises(OSError) as err, outputs.staged(root) as staging:
        (staging / "metrics").mkdir()
        (staging / "metrics" / "a").write_text("new a")
    assert err.value.filename == str(root / "metrics" / "a"), err.value
    line = faults.refused_write(err.value)
    assert (
        line
        == f"{root / 'metrics' / 'a'}: is a folder where a file goes: move it aside or remove it, then re-run"
    )


def test_unwritable_reports_are_refused_before_the_work(tmp_path, monkeypatch):
    root = tmp_path / "reports"
    (root / "metrics").mkdir(parents=True)
    # root ignores permission bits: stand in for an immutable folder (chattr +i) or another owner's
    refused = (root / "metrics", "Operation not permitted")
    monkeypatch.setattr(outputs, "unreplaceable", lambda folder: refused)
    worked = []
    with pytest.raises(outputs.OutputsError) as err, outputs.staged(root):
        worked.append(True)
    assert not worked, "the stage's work ran before the refusal"
    assert str(err.value).startswith(f"{root / 'metrics'}/ cannot hold the reports (Operation not permitted)")


def test_a_file_in_the_reports_folders_place_is_refused_at_once(tmp_path):
    (tmp_path / "reports").write_text("not a folder")
    with pytest.raises(outputs.OutputsError, match=r"reports/ cannot hold the reports \(.*is a file\)"):
        outputs.check_writable(tmp_path / "reports")
    with pytest.raises(outputs.OutputsError, match=r"cannot hold the bench report"):
        outputs.check_folder(tmp_path / "reports" / "sub", "bench report")  # bench --out reports/sub/x
    outputs.check_folder(tmp_path / "fresh" / "sub", "bench report")  # a folder still to make: fine
    assert not (tmp_path / "fresh").exists(), "the check made folders"


def test_a_full_disk_at_the_train_lock_names_the_lock_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train_lock.os, "write", full)
    with pytest.raises(OSError) as err, train_lock.hold(tmp_path / "work", "single-fp32"):
        pass
    line = faults.disk_full(err.value)
    assert line and str(tmp_path / "work") in line and "a file" not in line, line


def test_mlflows_own_traceback_of_a_failed_transaction_is_not_printed(tmp_path, monkeypatch, capsys):
    """A full disk under evaluate: MLflow's store logged two tracebacks (85 lines) before the
    error reached the stage's one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("")  # refused: main returns after setting up logging
    assert cli.main(["compare"]) == 2
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error")
    assert "Traceback" not in capsys.readouterr().err


def test_a_reports_folder_linked_to_another_filesystem_takes_its_files(tmp_path):
    """Hostile re-run: reports/metrics as a link to /dev/shm (or another disk) failed after the
    work with "Invalid cross-device link" (a 21-line traceback): rename cannot cross filesystems."""
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own (tmpfs) to cross filesystems")
    elsewhere = Path(tempfile.mkdtemp(dir=other))
    try:
        root = tmp_path / "reports"
        root.mkdir()
        (root / "metrics").symlink_to(elsewhere)
        (elsewhere / "a.json").write_text("old a")
        with outputs.staged(root) as staging:
            (staging / "metrics").mkdir()
            (staging / "metrics" / "a.json").write_text("new a")
        assert (elsewhere / "a.json").read_text() == "new a"
        assert [p.name for p in elsewhere.iterdir()] == ["a.json"]  # no copy left beside it
        assert (root / "metrics").is_symlink()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_a_whole_folder_that_is_a_link_stays_a_link_and_loses_its_stale_files(tmp_path):
    """Hostile re-run: compare replaced a linked reports/answer (or views) by a real folder, the
    link's target left with the old files."""
    root, elsewhere = tmp_path / "reports", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "answer").symlink_to(elsewhere)
    (elsewhere / "dropped-variant.json").write_text("a variant no longer in the study")
    (elsewhere / "kept.json").write_text("old")
    with outputs.staged(root, whole=("answer",)) as staging:
        (staging / "answer").mkdir()
        (staging / "answer" / "kept.json").write_text("new")
    assert (root / "answer").is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept.json"]
    assert (elsewhere / "kept.json").read_text() == "new"


@pytest.mark.parametrize("out", ["", "  ", "reports/", "{folder}"])
def test_a_report_prefix_naming_no_file_is_refused_before_the_measurement(tmp_path, out):
    """Hostile pass R: `ampbench bench --out ""` measured for 20-50 s, then "PosixPath('.') has an
    empty name", exit 1, nothing saved; `--out some/folder/` wrote some/folder.json beside it."""
    out = out.format(folder=tmp_path)
    with pytest.raises(outputs.OutputsError) as err:
        outputs.report_prefix(out, "bench report")
    assert str(err.value) == (
        f"--out {out!r} names no file: give the bench report's file name prefix, e.g. --out reports/mine "
        "(writes reports/mine.md, .json)"
    )
    assert outputs.report_prefix(str(tmp_path / "new" / "b"), "bench report") == tmp_path / "new" / "b"
