"""A data source is bounded in time and in size: a download that trickles fails within a window of
data.timeout_s (data.min_rate_kib_s), one larger than the disk stops before filling it, and an
archive that would unpack past the disk or any sane data set (a tar bomb) is refused from its
headers; each in one line, leaving nothing behind."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from ampbench.data import extract, fetch
from conftest import clean_env, new_project, small_tmpfs

TRICKLE_S = 0.2  # a byte this often: never a silence as long as the 1 s read timeout the tests set
GIVE_UP_S = 20  # the server's own end, so that code without a floor fails these tests, not hangs them


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(fetch, "_BACKOFF_S", 0.0)


@pytest.fixture
def source():
    """A local HTTP server: /body sends its headers, then a byte every TRICKLE_S; /headers a byte
    of its headers every TRICKLE_S (each trickle ends after GIVE_UP_S); /steady 96 KiB at ~65 KiB/s;
    /huge announces 4 TiB; /endless sends zeros without a length."""
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with contextlib.suppress(OSError):  # the client hung up: what a floor does
                if self.path.startswith("/headers"):
                    self._trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 10_000)
                elif self.path.startswith("/body"):
                    self._head(100_000)
                    self._trickle(b"\0" * 100_000)
                elif self.path.startswith("/huge"):  # 4 TiB announced; it never comes
                    self._head(4 << 40)
                    self.wfile.write(b"\0" * 1024)
                elif self.path.startswith("/endless"):  # no length: zeros until the client hangs up
                    self._head(None)
                    for _ in range(4096):  # 256 MiB at most
                        self.wfile.write(b"\0" * (64 << 10))
                else:
                    self._head(96 * 1024)
                    for _ in range(48):
                        self.wfile.write(b"\0" * 2048)
                        time.sleep(0.03)

        def _head(self, length: int | None) -> None:
            self.send_response(200)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.flush()

        def _trickle(self, data: bytes) -> None:
            end = time.monotonic() + GIVE_UP_S
            for byte in data:
                if stop.is_set() or time.monotonic() > end:
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(TRICKLE_S)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    stop.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    """Exit 1, no traceback, exactly one ERROR line: returns it."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out[-3000:]
    return errors[0]


def _download(project: Path, url: str, *settings: str) -> tuple[subprocess.CompletedProcess, float]:
    sets = [a for s in (f"data.url={url}", *settings) for a in ("--set", s)]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ampbench", "download", *sets],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=90,  # without a floor the trickle would run for GIVE_UP_S per attempt, then fail
    )
    return proc, time.monotonic() - start


@pytest.mark.slow  # the download stage as a subprocess
def test_a_trickling_download_fails_within_a_window_in_one_line(source, tmp_path):
    project = new_project(tmp_path / "p", store=False)
    url = f"{source}/body/cifar-10-python.tar.gz"
    proc, took = _download(project, url, "data.timeout_s=1", "data.retries=2")
    line = _one_error_line(proc)
    assert took < 20, f"{took:.1f} s: two attempts of one 1 s window each, plus the CLI's start"
    assert f"could not download '{url}' after 2 attempt(s): too slow: " in line, line
    assert "arrived in the last 1 s" in line and "under the floor of 10 KiB/s (data.min_rate_kib_s)" in line
    assert "use a faster one, or download the archive elsewhere and point data.url at the local file" in line
    assert not [p.name for p in (project / "data" / "raw").iterdir()]  # no .part left


def test_headers_that_trickle_are_cut_off_too(source, tmp_path):
    url = f"{source}/headers/cifar-10-python.tar.gz"
    start = time.monotonic()
    with pytest.raises(fetch.DataError) as err:
        fetch.fetch(url, tmp_path, retries=1, timeout_s=1)
    took = time.monotonic() - start
    assert "after 1 attempt(s): too slow: 0 B arrived in the last 1 s" in str(err.value), err.value
    assert took < 5, f"{took:.1f} s"
    assert os.listdir(tmp_path) == []


def test_a_slow_steady_download_above_the_floor_completes(source, tmp_path):
    """The floor's guard: 96 KiB at ~65 KiB/s, over three 0.5 s windows that each need 1 KiB: a
    download that keeps up is never cut, however many windows it spans."""
    url = f"{source}/steady/a.tar.gz"
    path = fetch.fetch(url, tmp_path, retries=1, timeout_s=0.5, min_rate_kib_s=2)
    assert path.read_bytes() == b"\0" * 96 * 1024


def test_a_download_announced_larger_than_the_disk_is_refused_before_reading(source, tmp_path):
    url = f"{source}/huge/cifar-10-python.tar.gz"
    start = time.monotonic()
    with pytest.raises(fetch.DataError) as err:
        fetch.fetch(url, tmp_path, retries=3, timeout_s=5)
    assert time.monotonic() - start < 3  # not retried, nothing awaited
    text = str(err.value)
    assert text.startswith(f"refusing to download '{url}': it is 4096.0 GiB, more than the "), text
    assert text.endswith("download it onto a larger disk and point data.url at the file"), text
    assert os.listdir(tmp_path) == []


def test_a_download_without_a_length_stops_before_the_disk_is_full(source, tmp_path):
    with small_tmpfs(tmp_path / "raw", "16m") as raw:
        with pytest.raises(fetch.DataError) as err:
            fetch.fetch(f"{source}/endless/cifar-10-python.tar.gz", raw, retries=3, timeout_s=5)
        text = str(err.value)
        # refused at the first read past 16 MiB less 0.8 MiB spare: well before ENOSPC
        assert re.search(r"it passed 1[56]\.\d MiB, more than the 16\.0 MiB free on ", text), text
        assert f"{raw} (less 819.2 KiB kept spare); if you trust it: free space there" in text, text
        assert os.listdir(raw) == []


def _bomb(folder: Path, zeros: int = 0, files: int = 0) -> Path:
    """A .tar.gz of one member of `zeros` zero bytes (a few KiB per 64 MiB) and `files` empty files."""
    archive = folder / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        if zeros:
            info = tarfile.TarInfo("train/airplane/zeros.png")
            info.size = zeros
            tar.addfile(info, io.BytesIO(bytes(zeros)))
        for i in range(files):
            tar.addfile(tarfile.TarInfo(f"train/airplane/{i:06d}.png"), io.BytesIO())
    assert archive.stat().st_size < 1 << 20
    return archive


@pytest.mark.slow  # the download stage as a subprocess
def test_a_bomb_bigger_than_the_free_space_is_refused_before_writing(tmp_path):
    archive = _bomb(tmp_path, zeros=64 << 20)
    project = new_project(tmp_path / "p", store=False)
    with small_tmpfs(project / "data" / "raw", "16m") as raw:
        proc, took = _download(project, str(archive))
        line = _one_error_line(proc)
        assert took < 30, f"{took:.1f} s"
        assert f"refusing archive {archive}: it would expand to at least 64.0 MiB in 1 member(s)" in line
        assert "more than the 16.0 MiB free on data/raw (less 819.2 KiB kept spare)" in line, line
        assert "free space there, point data/raw at a larger disk, or extract it yourself" in line, line
        assert os.listdir(raw) == []  # nothing partial, not even an empty temporary folder


def test_a_bomb_past_the_absolute_bound_is_refused_from_its_header(tmp_path, monkeypatch):
    monkeypatch.setattr(extract, "MAX_BYTES", 32 << 20)  # stands for 256 GiB on a disk that has room
    archive = _bomb(tmp_path, zeros=64 << 20)
    start = time.monotonic()
    with pytest.raises(fetch.DataError) as err:
        fetch.safe_extract(archive, tmp_path / "raw" / "extracted-x")
    assert time.monotonic() - start < 5
    text = str(err.value)
    assert "would expand to at least 64.0 MiB" in text and "the 32.0 MiB any data set archive may" in text
    assert text.endswith("; if you trust it: extract it yourself and point data.url at the folder"), text
    assert "\n" not in text and os.listdir(tmp_path / "raw") == []


def test_an_archive_of_too_many_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(extract, "MAX_MEMBERS", 500)  # stands for 2,000,000
    archive = _bomb(tmp_path, files=1000)
    with pytest.raises(fetch.DataError, match=r"in 501 member\(s\) .*more than the 500 files any data set"):
        fetch.safe_extract(archive, tmp_path / "raw" / "extracted-x")
    assert os.listdir(tmp_path / "raw") == []


def test_an_archive_of_more_files_than_free_inodes_is_refused(tmp_path):
    archive = _bomb(tmp_path, files=400)
    with small_tmpfs(tmp_path / "raw", "64m", nr_inodes=300) as raw:
        with pytest.raises(fetch.DataError) as err:
            fetch.safe_extract(archive, raw / "extracted-x")
        text = str(err.value)
        found = re.search(
            rf"in (\d+) member\(s\) .*more than the (\d+) free inodes \(files\) on {raw} "
            r"\(less (\d+) kept spare\); if you trust it: free space there",
            text,
        )
        assert found, text
        members, free, spare = map(int, found.groups())
        assert members == free - spare + 1 and 250 < members < 300, text  # the first one too many
        assert os.listdir(raw) == []
