"""`make run DATA=...` refused before DVC writes the value into params.yaml (dvc_guard.data_fault):
hostile re-run, `DATA=ftp://x/y` and `DATA=/dev/zero` left params.yaml rewritten after a failed
download stage."""

from __future__ import annotations

import pytest

from ampbench.dvc_guard import data_fault


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
    archive.write_bytes(b"")
    for data in (str(archive), str(tmp_path), archive.as_uri(), "https://example.org/c.tar.gz", ""):
        assert data_fault(data) == "", data
