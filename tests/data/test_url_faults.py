"""URLs that can never be fetched as written are one line naming data.url and the fix, tried once
(final pass J: a redirect loop was three lines a try, retried, "retry later"; `http://[::1:...`
was "Invalid IPv6 URL" alone; a space in the path was retried and blamed on the network)."""

from __future__ import annotations

import http.server
import threading

import pytest

from ampbench.data import fetch
from ampbench.data.errors import DataError


@pytest.fixture
def looping():
    """A local server whose every path redirects to itself; the number of requests it answered."""
    asked = []

    class Loop(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(302)
            self.send_header("Location", self.path)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Loop)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", asked
    httpd.shutdown()
    httpd.server_close()


def test_a_redirect_loop_is_one_line_and_one_attempt(looping, tmp_path):
    base, asked = looping
    with pytest.raises(DataError) as err:
        fetch.fetch(f"{base}/cifar.tar.gz", tmp_path, retries=3)
    message = str(err.value)
    assert "\n" not in message and "its redirects do not end (the server answered HTTP 302" in message
    assert message.endswith("; fix data.url") and len(asked) <= 11, (message, len(asked))  # urllib's 10 + 1


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://[::1:18765/x.tar.gz", "is not a valid URL (Invalid IPv6 URL); fix data.url"),
        ("http://127.0.0.1:9/my file (1).tar.gz", "percent-encode it in data.url (a space: %20)"),
    ],
)
def test_a_url_that_cannot_be_asked_for_is_one_line(url, said, tmp_path):
    with pytest.raises(DataError) as err:
        fetch.fetch(url, tmp_path, retries=3)
    assert said in str(err.value) and "network" not in str(err.value), err.value
