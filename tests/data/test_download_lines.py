"""A download is never silent for long: a line when the source answers (URL, size, where to), and
where no bar is drawn a progress line every download_lines.EVERY_S, so a trickling or stalled
source is reported while the rate floor's window runs, not only when it fails (issue 36, F7)."""

from __future__ import annotations

import contextlib
import http.server
import logging
import threading
import time

import pytest

from ampbench.data import download_lines, fetch
from conftest import image_folder_archive

EVERY_S = 0.4  # the progress interval here; the default 20 s keeps every gap under 30 s
WINDOW_S = 3  # data.timeout_s: the floor fails the trickle after one window
BYTE_EVERY_S = 0.1  # the trickle: 10 B/s, far under the default floor of 10 KiB/s


@pytest.fixture
def source():
    """/trickle announces 10 kB and sends a byte every BYTE_EVERY_S; /silent accepts the
    connection and sends nothing, headers included (each for at most 10 s)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with contextlib.suppress(OSError):  # the floor hung up
                end = time.monotonic() + 10
                if self.path.startswith("/silent"):
                    while time.monotonic() < end and not self.wfile.closed:
                        time.sleep(0.05)
                    return
                self.send_response(200)
                self.send_header("Content-Length", "10000")
                self.end_headers()
                while time.monotonic() < end:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(BYTE_EVERY_S)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def _lines_while_failing(url, tmp_path, caplog, monkeypatch) -> tuple[list[logging.LogRecord], float]:
    monkeypatch.setattr(download_lines, "EVERY_S", EVERY_S)
    monkeypatch.setattr(download_lines, "_bar_drawn", lambda: False)  # as under CI or a log file
    caplog.set_level(logging.INFO)
    start = time.time()
    # a silent source: the rate floor or the socket's own timeout, whichever a loaded machine
    # lets fire first (both are WINDOW_S); what is tested is the lines while waiting
    with pytest.raises(fetch.DataError, match="too slow|timed out"):
        fetch.fetch(url, tmp_path, retries=1, timeout_s=WINDOW_S)
    end = time.time()
    records = [r for r in caplog.records if r.name.startswith("ampbench.data")]
    stamps = [start, *(r.created for r in records), end]
    return records, max(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def test_a_trickling_download_says_it_started_and_how_far_it_got(source, tmp_path, caplog, monkeypatch):
    url = f"{source}/trickle/c.tar.gz"
    records, longest = _lines_while_failing(url, tmp_path, caplog, monkeypatch)
    messages = [r.getMessage() for r in records]
    assert messages[0] == f"downloading '{url}' (9.8 KiB) to {tmp_path / 'c.tar.gz'}", messages
    progress = [m for m in messages if m.startswith("downloading c.tar.gz: ")]
    assert len(progress) >= WINDOW_S / EVERY_S - 2, messages
    assert " of 9.8 KiB (" in progress[-1] and " B/s lately" in progress[-1], progress[-1]
    assert longest < EVERY_S + 0.5, f"{longest:.2f} s without a line (window {WINDOW_S} s): {messages}"


def test_a_source_that_never_answers_is_reported_while_waiting(source, tmp_path, caplog, monkeypatch):
    url = f"{source}/silent/c.tar.gz"
    records, longest = _lines_while_failing(url, tmp_path, caplog, monkeypatch)
    messages = [r.getMessage() for r in records]
    assert any(m.startswith(f"waiting for '{url}' to answer: ") for m in messages), messages
    assert longest < EVERY_S + 0.5, f"{longest:.2f} s without a line: {messages}"


def test_the_default_interval_keeps_every_gap_under_30_s():
    assert download_lines.EVERY_S <= 25


def test_extracting_and_decoding_without_a_terminal_say_how_far_they_got(tmp_path, monkeypatch, caplog):
    """Extracting and decoding CIFAR-10's 60,000 JPEGs takes a minute on 2 cores, silent where no
    bar is drawn (hostile re-run: 69 s before the download stage's first line): a line as each
    starts and every EVERY_S."""
    from ampbench.data import prepared

    archive = image_folder_archive(tmp_path)  # also tmp_path/imagefolder/{train,test}/<class>/*.png
    monkeypatch.setattr(download_lines, "EVERY_S", 0.0)  # every item: the test sees the lines
    with caplog.at_level("INFO", logger="ampbench.data.download_lines"):
        fetch.safe_extract(archive, tmp_path / "extracted")
        ds = prepared.load_image_folder(tmp_path / "imagefolder")
    lines = [r.getMessage() for r in caplog.records]
    extracting = [line for line in lines if line.startswith("extracting tiny-cifar.tar.gz: ")]
    assert extracting[0] == "extracting tiny-cifar.tar.gz: 112 files", extracting  # 90 images, 22 folders
    decoding = [line for line in lines if line.startswith("decoding ")]
    assert len(ds["train_labels"]) == 60 and decoding[0].endswith("/train/: 60 images"), decoding
    assert decoding[-1].endswith("/test/: 29 of 30 images"), decoding[-1]  # pytest captures: no bar
