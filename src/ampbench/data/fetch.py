"""Get a data source onto local disk, verified: downloads, checksums, retries, safe extraction.

``fetch`` turns a source (the official CIFAR-10 URL, any http(s) or file:// URL, a local archive
or a local folder) into a local path whose checksums were verified; a download attempt that falls
under a minimum rate is cut off (``rate_floor``), and one larger than the disk can take is refused.
``safe_extract`` (``extract``) unpacks an archive without trusting it. What the files hold is
``ampbench.data.prepared``'s business.

Every failure raises ``DataError`` whose message says what went wrong, where, and how to fix it.
Nothing partial is ever left at a final path: downloads and extractions go to a temporary name in
the same folder and are renamed into place only once complete and verified.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from ampbench import atomic
from ampbench.data.download_lines import DownloadLines
from ampbench.data.errors import DataError, no_space, no_space_message, size_text
from ampbench.data.extract import CHUNK, Bound, Room, safe_extract
from ampbench.data.rate_floor import Floor, RateFloor

__all__ = ["CHUNK", "CIFAR10_MD5", "CIFAR10_URL", "DataError", "fetch", "no_network_fix", "safe_extract"]

log = logging.getLogger(__name__)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
_BACKOFF_S = 0.5  # sleep _BACKOFF_S * attempt between download attempts; tests set it to 0
_LOCAL_COPY_FIX = (
    "download the archive elsewhere and point data.url at the local file, e.g. "
    "`dvc exp run -S data.url=/path/to/cifar-10-python.tar.gz`, "
    "`make run DATA=/path/to/cifar-10-python.tar.gz` or "
    "`mlflow run . -P data_url=/path/to/cifar-10-python.tar.gz`"
)
NAME_MAX = 200  # bytes of a downloaded file's name (filesystems take 255, its partial copy adds a suffix)
RESUME_ENV = "AMPBENCH_RESUME_COMMAND"  # the command that started the pipeline (the Makefile sets it)


def no_network_fix(why: str = "no network?") -> str:
    """What to do offline, in the terms of the command the user typed: `make demo` gets `make demo
    DATA=...` (a `make run` or `dvc exp run` there would start the days-long study, or the wrong one)."""
    started = os.environ.get(RESUME_ENV, "").split()
    if started[:1] == ["make"] and len(started) > 1:
        return (
            f"{why} download the archive elsewhere and pass the local file: "
            f"`make {started[1]} DATA=/path/to/cifar-10-python.tar.gz`"
        )
    return f"{why} {_LOCAL_COPY_FIX}"


def _network_fix(url: str) -> str:
    """A server on this machine that does not answer is no network fault (hostile pass WARN: "no
    network? download the archive elsewhere" of a local server that was down)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host in ("localhost", "::1") or host.startswith("127."):
        return f"the server at {host} runs on this machine: start it, or fix data.url"
    return no_network_fix()


class _AttemptFailed(Exception):
    """One download attempt failed in a way worth retrying; `fix` is the hint for the user."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.fix = fix


def _shown(source: str, limit: int = 80) -> str:
    """The source as an error quotes it: at most `limit` characters."""
    return repr(source if len(source) <= limit else source[: limit - 3] + "...")


def _hashers(source: str, sha256: str) -> dict[str, tuple]:
    """Name -> (hash object, expected hex digest) for every checksum that applies to `source`."""
    wanted = {"md5": (hashlib.md5(), CIFAR10_MD5)} if source == CIFAR10_URL else {}
    if sha256:
        wanted["sha256"] = (hashlib.sha256(), sha256.lower())
    return wanted


def _mismatch(hashers: dict[str, tuple]) -> str:
    """Empty if every digest matches, else a message naming expected and actual digests."""
    actual = {name: h.hexdigest() for name, (h, _) in hashers.items()}
    expected = {name: want for name, (_, want) in hashers.items()}
    bad = [f"{n} expected {expected[n]}, got {d}" for n, d in actual.items() if d != expected[n]]
    return "checksum mismatch: " + "; ".join(bad) if bad else ""


def _verify_file(path: Path, source: str, sha256: str) -> str:
    hashers = _hashers(source, sha256)
    with open(path, "rb") as f:
        while hashers and (chunk := f.read(CHUNK)):
            for h, _ in hashers.values():
                h.update(chunk)
    return _mismatch(hashers)


def fetch(
    source: str,
    cache_dir: Path,
    *,
    sha256: str = "",
    retries: int = 3,
    timeout_s: float = 60.0,
    min_rate_kib_s: float = 10.0,
) -> Path:
    """Return a local, verified path for `source` (http(s)/file:// URL, archive file or folder).

    Local files are used in place (sha256-checked if given); folders are returned as is. URLs are
    downloaded into `cache_dir`, verified while streaming and renamed into place only when whole;
    an attempt fails once a window of `timeout_s` brings under `min_rate_kib_s` (rate_floor.py).
    """
    try:
        parsed = urllib.parse.urlparse(source)
    except ValueError as err:  # "Invalid IPv6 URL" (final pass J: that alone, no setting, no fix)
        raise DataError(f"data source {_shown(source)} is not a valid URL ({err}); fix data.url") from None
    if parsed.scheme in ("http", "https"):
        floor = Floor(min_rate_kib_s * 1024, timeout_s)
        return _download(source, Path(cache_dir), sha256, max(retries, 1), floor)
    local = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else source
    path = Path(local).expanduser()
    try:
        exists, is_file, is_dir = path.exists(), path.is_file(), path.is_dir()
    except OSError as err:  # a name too long for the filesystem, a loop of links, ...
        raise DataError(
            f"data source {_shown(source)} cannot be read ({err.strerror}); fix data.url"
        ) from None
    if not exists:
        if "://" in source and parsed.scheme not in ("", "file"):  # ftp://, s3://: not a path either
            raise DataError(
                f"data source {_shown(source)}: {parsed.scheme}:// is not supported (http, https, file "
                "or a local path); download it yourself and point data.url at the file"
            )
        raise DataError(f"data source {_shown(source)} does not exist; fix data.url")
    if not (is_file or is_dir):  # /dev/zero, a FIFO, a socket: no end, or no archive
        raise DataError(
            f"data source {_shown(source)} is neither a file nor a folder (a device, FIFO or socket); "
            "point data.url at the archive or its extracted folder"
        )
    if is_file and (problem := _verify_file(path, source, sha256)):
        raise DataError(f"{path}: {problem}; fix data.sha256 or replace the file")
    return path


def _download(url: str, cache_dir: Path, sha256: str, attempts: int, floor: Floor) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / cache_name(url)
    # Without a checksum a cached copy can't be shown to be this URL's content: download again.
    if final.is_file() and _hashers(url, sha256) and not _verify_file(final, url, sha256):
        log.info("using cached %s (checksum ok)", final)
        return final
    for attempt in range(1, attempts + 1):
        try:
            _download_once(url, final, sha256, floor)
            return final
        except _AttemptFailed as exc:
            error = exc
            log.warning("download %s failed (attempt %d/%d): %s", _shown(url), attempt, attempts, exc)
            if attempt < attempts:
                time.sleep(_BACKOFF_S * attempt)
    raise DataError(f"could not download {_shown(url)} after {attempts} attempt(s): {error}; {error.fix}")


def cache_name(url: str) -> str:
    """The downloaded file's name: the URL's last path part, or where that is no file name this
    filesystem takes (hostile re-run: a 100,000-character URL gave an OSError traceback, "File
    name too long") a short one kept apart by the URL's digest, its archive suffix kept."""
    name = PurePosixPath(urllib.parse.urlparse(url).path).name or "download"
    if len(name.encode()) <= NAME_MAX and name not in (".", ".."):
        return name
    suffix = "".join(PurePosixPath(name).suffixes[-2:])
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return f"download-{digest}{suffix if len(suffix) <= 16 else ''}"


def _slow_link_fix() -> str:
    return no_network_fix("a slow link? use a faster one, or") + ", or lower data.min_rate_kib_s"


def _download_once(url: str, final: Path, sha256: str, spec: Floor) -> None:
    """Stream `url` to a temp file next to `final`; rename into place only if whole and verified."""
    hashers = _hashers(url, sha256)
    _remove_stale(final, "part", legacy=f"{final.name}.*.part")
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=atomic.temp_name(final, "part") + "-")
    try:
        with os.fdopen(fd, "wb") as out, RateFloor(*spec) as floor:
            try:
                with (
                    DownloadLines(_shown(url), final, floor) as lines,
                    floor.opener().open(url, timeout=spec.window_s) as resp,
                ):
                    lines.answered(resp)
                    size, got = _stream(resp, out, hashers, floor, url, final)
            except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
                if no_space(exc):  # our write failed, not the network: retrying cannot help
                    raise DataError(no_space_message(Path(tmp), final)) from exc
                if floor.verdict:  # the floor cut the connection: say why, not how it broke
                    raise _AttemptFailed(floor.verdict, _slow_link_fix()) from None
                if isinstance(exc, urllib.error.HTTPError):  # the server answered: no network fault
                    _server_said(url, exc)
                if isinstance(exc, http.client.InvalidURL):  # a space: not the network (pass J)
                    raise DataError(
                        f"data source {_shown(url)} cannot be asked for as it is written "
                        f"({' '.join(str(exc).split())[:160]}); percent-encode it in data.url (a space: %20)"
                    ) from None
                raise _AttemptFailed(f"network error: {exc}", _network_fix(url)) from exc
            if floor.verdict and not 0 <= size == got:  # cut: without a length, EOF looks whole
                raise _AttemptFailed(floor.verdict, _slow_link_fix())
            if size >= 0 and got != size:
                raise _AttemptFailed(f"short read: got {got} of {size} bytes", no_network_fix())
            if problem := _mismatch(hashers):
                raise _AttemptFailed(problem, "check data.url and data.sha256, or retry later")
            out.flush()
            os.fsync(out.fileno())  # bytes must be on disk before the final name says "complete"
        os.replace(tmp, final)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _server_said(url: str, exc: urllib.error.HTTPError) -> None:
    """A refusal the server will give again (404, 403, a redirect loop: a DataError at once, no
    retry), or a failure of its own worth another attempt (5xx, 408, 429), each with its fix, never
    "no network?" (final pass H: a 404 was retried three times, then blamed on the network; pass J:
    a redirect loop, three lines a try, "retry later")."""
    said = f"the server answered HTTP {exc.code} {' '.join(str(exc.reason).split())[:160]}"
    if 300 <= exc.code < 400:  # urllib follows redirects: one that reaches here loops or goes nowhere
        loop = f"its redirects do not end ({said})"
        raise DataError(f"could not download {_shown(url)}: {loop}; fix data.url") from None
    if 400 <= exc.code < 500 and exc.code not in (408, 429):
        raise DataError(f"could not download {_shown(url)}: {said}; fix data.url") from None
    raise _AttemptFailed(said, "retry later, or download the archive elsewhere and set data.url to it")


def _stream(resp, out, hashers: dict, floor: RateFloor, url: str, final: Path) -> tuple[int, int]:
    """Copy the body to `out`, hashing and counting as it arrives: (announced size or -1, got).

    A body larger than `final`'s filesystem can take (extract.Room) is refused before a byte is
    read when it is announced, else once it passes the bound: hours on a slow link must not end
    in a full disk. Not retried: the next attempt would be as large."""
    room = Room.of(final.parent).bytes
    size = int(resp.headers.get("Content-Length") or -1)
    if size > room.amount:
        raise DataError(_too_large(url, f"it is {size_text(size)}", room, final.parent))
    got, total = 0, size if size >= 0 else None
    with tqdm(total=total, unit="B", unit_scale=True, desc=final.name, disable=None) as bar:
        # read1: what has arrived, at once (read(CHUNK) waits for a whole MiB, which a slow
        # link brings in minutes: the floor would see no progress)
        while chunk := resp.read1(CHUNK):
            got += len(chunk)
            if got > room.amount:
                raise DataError(_too_large(url, f"it passed {size_text(got)}", room, final.parent))
            out.write(chunk)
            for h, _ in hashers.values():
                h.update(chunk)
            floor.arrived(len(chunk))
            bar.update(len(chunk))
    return size, got


def _too_large(url: str, what: str, room: Bound, folder: Path) -> str:
    yourself = "download it onto a larger disk and point data.url at the file"
    return f"refusing to download {_shown(url)}: {what}, more than {room.text}; {room.fix(folder, yourself)}"


def _remove_stale(path: Path, kind: str, legacy: str = "") -> None:
    """Temporaries of a killed writer; `legacy`: the glob of older versions' names (no pid in them)."""
    atomic.remove_stale_temps(path, kind)
    for stale in path.parent.glob(legacy) if legacy else ():
        stale.unlink(missing_ok=True)
