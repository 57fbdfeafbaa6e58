"""How a command's output is set up before it runs: its log lines' format and handler (never inside
a progress bar), libraries' own lines kept out unless --verbose, and output any terminal can print."""

from __future__ import annotations

import logging
import os
import re
import sys


def logging_to_stderr(verbose: bool) -> None:
    """Every line on stderr, in the commands' one format (the rank in a DDP worker's); libraries'
    own INFO lines kept out unless --verbose."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s"
        if "RANK" in os.environ
        else "%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[BarSafeHandler()],
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_no_credentials)
    if not verbose:
        # MLflow's "Creating initial MLflow database tables...", and its traceback of a failed
        # transaction (a full disk) before the error reaches our one line: not the user's business
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        # torch's own INFO lines ("FakeTensor cache stats" at an interrupted exit) under our INFO root
        logging.getLogger("torch").setLevel(logging.WARNING)
        # its "mkdir -p failed ... set the MPLCONFIGDIR environment variable" under a read-only HOME:
        # it falls back to a temporary folder by itself (hostile pass WARN: 3 lines of noise)
        logging.getLogger("matplotlib").setLevel(logging.ERROR)
        # "Retrying (Retry(total=0, ...)) after connection broken by ..." of a tracking server that
        # went away: eight lines before our one (hostile pass WARN), which says what to do
        logging.getLogger("urllib3").setLevel(logging.ERROR)


_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s]*@")


def hide_credentials(text: str) -> str:
    """``text`` with the user name and password of any URL in it replaced by ***."""
    return _USERINFO.sub(r"\1***@", text)


def _no_credentials(record: logging.LogRecord) -> bool:
    """No line shows a URL's password (hostile pass T: `MLFLOW_TRACKING_URI=postgresql://u:pw@...`
    was printed whole in the missing-driver line; data.url's is refused, and hidden, already)."""
    message = record.getMessage()
    if (hidden := hide_credentials(message)) != message:
        record.msg, record.args = hidden, ()
    return True


class BarSafeHandler(logging.StreamHandler):
    """Log lines on stderr that never land inside a progress bar: while a tqdm bar is drawn, a line
    goes through ``tqdm.write``, which clears the bar, prints the line and draws the bar again."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")  # imported by whoever draws a bar; not imported here for it
        if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tqdm.tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging's own rule: a failed emit never raises
            self.handleError(record)


def printable() -> None:
    """Whatever the terminal's encoding (``PYTHONIOENCODING=ascii``, a C locale), printing a report
    (± and Δ in compare's table) never fails: a character stdout cannot encode prints as '?'."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.errors == "strict":
            stream.reconfigure(errors="replace")


def charts_to_files() -> None:
    """The commands draw their charts into files (matplotlib's Agg), whatever MPLBACKEND says: a
    notebook's (``module://matplotlib_inline...``, exported by Jupyter's terminal) made matplotlib's
    import fail with its list of backends (hostile pass P: evaluate and compare, exit 1)."""
    os.environ.pop("MPLBACKEND", None)
