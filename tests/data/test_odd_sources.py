"""Data sources that are no archive and no folder are refused in one line naming data.url."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ampbench.data import fetch


def test_a_device_is_neither_file_nor_folder(tmp_path):
    with pytest.raises(fetch.DataError, match=r"'/dev/zero' is neither a file nor a folder.*data\.url"):
        fetch.fetch("/dev/zero", tmp_path)


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "data.tar.gz"
    os.mkfifo(fifo)  # opening it for reading would block forever
    with pytest.raises(fetch.DataError, match="neither a file nor a folder"):
        fetch.fetch(str(fifo), tmp_path)


def test_a_name_too_long_is_one_short_line(tmp_path):
    source = "/tmp/" + "x" * 300 + ".tar.gz"
    with pytest.raises(fetch.DataError) as err:
        fetch.fetch(source, tmp_path)
    message = str(err.value)
    assert "cannot be read (File name too long); fix data.url" in message
    assert len(message) < 160 and "..." in message  # the 300 characters are not repeated


def test_a_url_too_long_for_a_file_name_downloads_under_a_short_one(tmp_path):
    """Hostile re-run: `data.url=http://x/<100,000 characters>` gave an OSError traceback ("File name
    too long") before any byte was asked for; nothing listens on port 9, so the download fails
    in one line, and the cache's name is one the filesystem takes."""
    url = "http://127.0.0.1:9/" + "a" * 100_000 + ".tar.gz"
    name = fetch.cache_name(url)
    assert name.startswith("download-") and name.endswith(".tar.gz") and len(name) < 60
    assert name != fetch.cache_name(url.replace("a", "b")) and name == fetch.cache_name(url)
    assert fetch.cache_name("https://host/path/cifar-10-python.tar.gz") == "cifar-10-python.tar.gz"
    with pytest.raises(fetch.DataError, match=r"could not download .*after 1 attempt"):
        fetch.fetch(url, tmp_path, retries=1)


def test_a_folder_and_a_file_still_pass(tmp_path):
    (tmp_path / "archive.tar.gz").write_bytes(b"x")
    assert fetch.fetch(str(tmp_path), tmp_path / "cache") == Path(tmp_path)
    assert fetch.fetch(str(tmp_path / "archive.tar.gz"), tmp_path / "cache").name == "archive.tar.gz"


@pytest.mark.parametrize("source", ["ftp://example.org/cifar.tar.gz", "s3://bucket/cifar.tar.gz"])
def test_an_unsupported_url_scheme_is_named(tmp_path, source):
    """Hostile pass: `ftp://x/y` was read as a local path and reported as "does not exist"."""
    scheme = source.split("://")[0]
    with pytest.raises(fetch.DataError, match=rf"{scheme}:// is not supported \(http, https, file"):
        fetch.fetch(source, tmp_path)
