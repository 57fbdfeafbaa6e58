"""`make run DATA=...` refused before DVC writes the value into params.yaml (dvc_guard.data_fault):
hostile re-run, `DATA=ftp://x/y` and `DATA=/dev/zero` left params.yaml rewritten after a failed
download stage."""

from __future__ import annotations

import pytest
import yaml

from ampbench.dvc_guard import data_fault, params_fault
from conftest import REPO


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("ftp://x/y", "DATA=ftp://x/y: ftp:// is not supported (http, https, file or a local path)"),
        ("/dev/zero", "DATA=/dev/zero: is neither a file nor a folder (a device, FIFO or socket)"),
        ("/nonexistent/c.tar.gz", "DATA=/nonexistent/c.tar.gz: no such file or folder; point DATA"),
        ("file:///nonexistent/c.tar.gz", "DATA=file:///nonexistent/c.tar.gz: no such file or folder"),
    ],
)
def test_a_data_the_download_stage_would_refuse_is_one_line(data, said):
    assert data_fault(data).startswith(said), data_fault(data)


def test_a_file_a_folder_or_a_url_passes(tmp_path):
    archive = tmp_path / "c.tar.gz"
    archive.write_bytes(b"\x1f\x8b")  # how a gzip stream starts: the download stage reads the rest
    for data in (str(archive), str(tmp_path), archive.as_uri(), "https://example.org/c.tar.gz", ""):
        assert data_fault(data) == "", data


def test_a_params_file_without_the_variant_axes_is_one_line_with_the_fix(tmp_path, monkeypatch):
    """Hostile pass WARN: DVC's "failed to parse 'stages.train.matrix' in 'dvc.yaml': Could not
    find 'variants.parallel'", with no fix."""
    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    assert params_fault() == ""  # no params.yaml: not a project folder, DVC says so
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    assert params_fault() == ""  # the shipped file
    del params["variants"]["precision"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    assert params_fault().startswith("ERROR: params.yaml has no variants.precision: dvc.yaml's matrix")
    del params["variants"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    said = params_fault()
    assert said.startswith("ERROR: params.yaml has no variants.parallel, variants.precision"), said
    assert "`git checkout params.yaml`" in said
    (tmp_path / "dvc.yaml").write_text("stages: {}\n", encoding="utf-8")
    assert params_fault() == ""  # a pipeline of the user's own that reads no variant axes


def test_a_data_file_that_is_no_archive_is_refused_before_the_estimate(tmp_path):
    """Hostile pass WARN: `make run DATA=<an HTML page>` was refused by the download stage after
    the estimate's ~15 s, its fix naming data.url, a setting the user never typed."""
    import tarfile

    page, text, empty, tar = (tmp_path / name for name in ("page.tar.gz", "notes.txt", "e.tar", "ok.tar"))
    page.write_text("<!DOCTYPE html><html><body>Download</body></html>", encoding="utf-8")
    text.write_text("not an archive", encoding="utf-8")
    empty.write_bytes(b"")
    with tarfile.open(tar, "w") as archive:
        archive.add(text, "train/notes.txt")
    assert data_fault(str(page)).startswith(f"DATA={page}: is a web page (HTML), not the archive")
    assert data_fault(str(text)).startswith(f"DATA={text}: is not a tar archive, nor a gzip")
    assert data_fault(str(empty)).startswith(f"DATA={empty}: is an empty file; point DATA at")
    assert data_fault(str(tar)) == ""


def test_a_variant_trained_outside_the_pipeline_is_refused_before_dvc_deletes_it(tmp_path, monkeypatch):
    """Hostile pass W: `python -m ampbench.dvc_run repro -f -s train@single-autocast` while an
    `ampbench train` of that variant ran: DVC deleted models/single-autocast/ as the stage started,
    then the stage refused the second trainer. The published models were lost."""
    import subprocess
    import sys
    import time

    from ampbench import dvc_guard

    monkeypatch.chdir(tmp_path)
    lock = tmp_path / "checkpoints" / "single-autocast" / ".train.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert dvc_guard.trainer_fault() == ""
    hold = (
        "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
        "print(1, flush=True); time.sleep(60)"
    )
    trainer = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline() == "1\n"
        said = dvc_guard.trainer_fault()
    finally:
        trainer.kill()
        trainer.wait()
    assert said.startswith(f"ERROR: single-autocast is being trained by pid {trainer.pid}, outside"), said
    assert f"kill {trainer.pid}" in said and "models/single-autocast/" in said
    time.sleep(0.1)
    assert dvc_guard.trainer_fault() == ""  # ended: nothing in the way
