"""What a broken MLflow store looks like, in one line: the server gone, the database corrupt,
locked or full. ``classify`` finds the fault in a chain of wrapped exceptions (MLflow, SQLAlchemy,
sqlite, requests) by their packages and words, importing none; ``describe`` says what failed, which
store, and what to do; ``disk_full``, a full disk; ``store_*``, what ``tracking.store`` finds first.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ampbench.chains import chain

# Top-level packages whose exceptions mean "the store failed" (matched by name: nothing imported).
STORE_PACKAGES = {"mlflow", "sqlalchemy", "sqlite3", "alembic", "requests", "urllib3", "http"}

# (kind, phrases in the error text, the reason shown); the first kind that matches wins.
_SIGNS = (
    ("locked", ("database is locked", "database table is locked"), "sqlite: database is locked"),
    ("full", ("database or disk is full",), "sqlite: database or disk is full"),
    (
        "corrupt",
        (
            "file is not a database",
            "database disk image is malformed",
            "malformed database schema",
            "file is encrypted",
        ),
        "",
    ),
    ("unopenable", ("unable to open database file",), "sqlite: unable to open database file"),
    ("readonly", ("attempt to write a readonly database",), "sqlite: attempt to write a readonly database"),
    ("refused", ("connection refused", "failed to establish a new connection"), "connection refused"),
    ("silent", ("read timed out", "timed out", "timeout"), "no answer in time"),
    ("dropped", ("connection aborted", "remotedisconnected", "connection reset", "remote end closed"), ""),
    ("unresolved", ("name or service not known", "name resolution", "nodename nor servname"), ""),
    # a server that asks for a login (basic-auth): before "http", whose fix it would not be
    ("login", ("error code 401", "error code 403"), ""),
    ("http", ("failed with error code",), ""),
    ("scheme", ("got unsupported uri", "could not find a registered"), ""),
    ("folder", ("filesystem tracking backend",), "MLflow's folder store is in maintenance mode"),
)


SCHEMES = (
    "set MLFLOW_TRACKING_URI to sqlite:///<path>.db or http(s)://<host>:<port> of a tracking "
    "server, or unset it (the repo's mlflow.db)"
)

FOLDER_STORE = "or MLFLOW_ALLOW_FILE_STORE=true"  # MLflow's folder store, in maintenance mode
OTHER = "re-run; --debug (or AMPBENCH_DEBUG=1) shows the traceback"
LOGIN = (
    "it asks for a login; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
    "MLFLOW_TRACKING_TOKEN) to an account it knows"
)


def _from_store(err: BaseException) -> bool:
    return any(c.__module__.partition(".")[0] in STORE_PACKAGES for e in chain(err) for c in type(e).__mro__)


def classify(err: BaseException) -> tuple[str, str] | None:
    """(kind, short reason) of a store fault in err's chain, or None if it is none."""
    if not _from_store(err):
        return None
    texts = [f"{type(e).__name__}: {e}" for e in chain(err)]
    for kind, phrases, reason in _SIGNS:
        for text in texts:
            low = text.lower()
            hit = next((p for p in phrases if p in low), None)
            if hit:
                if not reason:  # the phrase in its own words, e.g. "file is not a database"
                    reason = _cut(text[low.index(hit) :], 120).rstrip(").'\"")
                return kind, reason
    return "other", _cut(texts[0], 200)


def _cut(text: str, most: int) -> str:
    """The first line of `text`, at most `most` characters, cut between words (pass I: "... set co")."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= most else line[:most].rsplit(" ", 1)[0] + " ..."


def describe(err: BaseException, uri: str, db: Path | None) -> str | None:
    """One line for a store fault in err's chain (what failed, which store, the fix), or None.

    `uri`: the store the stage used; `db`: its sqlite file, if it is one.
    """
    found = classify(err)
    if found is None:
        return None
    kind, reason = found
    rerun = "then re-run the same command"
    if kind in ("refused", "silent", "dropped", "unresolved"):  # unresolved: no server to start (pass I)
        again = "start it again (`mlflow server --backend-store-uri ...`), or fix"
        text = (
            f"MLflow tracking server {uri} is not answering ({reason}): "
            f"{'its host name is unknown: fix' if kind == 'unresolved' else again} or unset "
            f"MLFLOW_TRACKING_URI (unset: the repo's mlflow.db); {rerun}"
        )
    elif kind == "login":  # hostile pass L: "see the server's log", for a server that wants a login
        text = f"MLflow tracking server {uri} refused this user ({reason}): {LOGIN}, {rerun}"
    elif kind == "http":
        text = f"MLflow tracking server {uri} failed a request ({reason}): see the server's log; {rerun}"
    elif kind == "corrupt" and db is None:
        text = f"MLflow store {uri} is corrupt ({reason}): repair or replace it, or fix MLFLOW_TRACKING_URI"
    elif kind == "corrupt":
        text = (
            f"MLflow store {uri} is corrupt ({reason}): move {db} aside (`mv {db} {db}.broken`) to start "
            "an empty store, restore it from a backup, or point MLFLOW_TRACKING_URI at another store; "
            + rerun
        )
    elif kind == "locked":
        holders = lock_holders(db) if db else ""
        text = (
            f"MLflow store {uri} is locked by {holders or 'another process'} ({reason}): wait for it to "
            f"finish, or end it; {rerun}"
        )
    elif kind == "full":
        text = (
            f"No space left on device for MLflow store {uri} ({reason}): free space on its filesystem, or "
            f"point MLFLOW_TRACKING_URI at a store elsewhere; {rerun}"
        )
    elif kind == "unopenable":
        where = db.parent if db else uri
        text = (
            f"MLflow store {uri} cannot be opened ({reason}): make {where} exist and writable, or fix "
            "MLFLOW_TRACKING_URI"
        )
    elif kind == "readonly":
        files = f"{db} and its folder {db.parent}" if db else uri
        text = (
            f"MLflow store {uri} cannot be written ({reason}): make {files} writable by this user, or "
            f"point MLFLOW_TRACKING_URI at another store; {rerun}"
        )
    elif kind == "scheme":  # its first sentence: the list of schemes that follows is cut short
        text = f"MLflow store {uri}: not a kind of store MLflow knows ({reason.split('. ')[0]}); {SCHEMES}"
    elif kind == "folder":  # final pass J: MLflow's text cut mid-word; file://: the folder may not exist
        text = f"MLflow store {uri} names a folder store ({reason}); {SCHEMES}, {FOLDER_STORE}"
    else:
        text = f"MLflow store {uri} failed ({reason}); check the store (or MLFLOW_TRACKING_URI) and {OTHER}"
    return text


def store_is_folder(uri: str, db: Path) -> str:
    """A sqlite store's path is a folder: sqlite cannot open it, and MLflow retries for minutes."""
    return (
        f"MLflow store {uri} cannot be opened: {db} is a folder, not a database file: move it aside "
        f"(`mv {db} {db}.folder`) so that a new store is created there, or point MLFLOW_TRACKING_URI at "
        "the store's database file; then re-run the same command"
    )


def store_folder_unwritable(uri: str, folder: Path, reason: str) -> str:
    """The folder of a sqlite store takes no new files: sqlite keeps its journal and lock there."""
    return (
        f"MLflow store {uri} cannot be written: its folder {folder} cannot take new files ({reason}), "
        "and sqlite writes its journal there: make that folder writable by this user, or point "
        "MLFLOW_TRACKING_URI at a store in a writable folder; then re-run the same command"
    )


def store_files_unwritable(uri: str, refused: list[tuple[Path, OSError]]) -> str:
    """Files of a sqlite store this user cannot write (`refused`: each with the error of opening it
    for writing), with the command that gives them back: `sudo chown` for files of another user
    (a `sudo make run`), `chmod u+w` for read-only ones, else the error in its own words."""
    path, err = refused[0]
    names = " ".join(str(p) for p, _ in refused)
    try:
        st = path.stat()
    except OSError:
        st = None
    me = _user(os.geteuid())
    if st is not None and st.st_uid != os.geteuid():
        what = f"{path} belongs to {_user(st.st_uid)}, not to {me} (left by a `sudo` run?)"
        fix = f"give it back (`sudo chown {me} {names}`)"
    elif st is not None and not st.st_mode & 0o200:
        what, fix = f"{path} is read-only (mode {st.st_mode & 0o777:04o})", f"`chmod u+w {names}`"
    else:
        what, fix = f"{path} refuses writes", f"make {names} writable by this user"
    return (
        f"MLflow store {uri} cannot be written: {what} ({err.strerror or type(err).__name__}): {fix}, "
        "or point MLFLOW_TRACKING_URI at another store; then re-run the same command"
    )


def artifact_root_unwritable(root: Path, experiment: str, uri: str, reason: str) -> str:
    """The experiment's artifact folder takes no files: evaluate and compare log theirs there."""
    return (
        f"MLflow artifact root {root} of experiment {experiment!r} (store {uri}) cannot hold the runs' "
        f"files ({reason}): make it a folder this user can write to (or remove what is in its place), "
        "then re-run the same command"
    )


def run_artifacts_unwritable(path: Path, run_folder: Path, run_id: str, uri: str, reason: str) -> str:
    """A run's own artifact folder (or a file in it) refuses this user: left by a `sudo` run."""
    return (
        f"MLflow run {run_id}'s artifacts (store {uri}) cannot be written: {path} "
        f"({_owned_by(path)}{reason}): give the run's folder back (`sudo chown -R "
        f"{_user(os.geteuid())} {run_folder}`) or make it writable by this user, then re-run the same command"
    )


def _owned_by(path: Path) -> str:
    """'<p> belongs to <user>, not to <me>; ' for the nearest existing `p` of `path` if another user
    owns it, else ''."""
    for p in (path, *path.parents):
        try:
            uid = p.stat().st_uid
        except OSError:
            continue
        me = os.geteuid()
        if uid == me:
            return ""
        return f"{'' if p == path else f'{p} '}belongs to {_user(uid)}, not to {_user(me)}; "
    return ""


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def lock_holders(path: Path) -> str:
    """'pid N (name)' of the other processes holding a lock on `path` (Linux /proc/locks), or ''."""
    return ", ".join(f"pid {pid} ({_comm(pid)})" for pid in lock_pids(path))


def lock_pids(path: Path) -> list[int]:
    """The other processes holding a lock on `path` (Linux /proc/locks); [] if none or unknown."""
    try:
        st = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    dev, pids = (os.major(st.st_dev), os.minor(st.st_dev)), []
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        for i, field in enumerate(fields[1:], 1):
            parts = field.split(":")
            if len(parts) == 3 and parts[2] == str(st.st_ino):
                try:
                    same = (int(parts[0], 16), int(parts[1], 16)) == dev
                    pid = int(fields[i - 1])
                except ValueError:
                    continue
                if same and pid > 0 and pid != os.getpid() and pid not in pids:
                    pids.append(pid)
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"


def disk_full(err: BaseException) -> str | None:
    """One line for an OSError ENOSPC/EDQUOT anywhere in err's chain (naming its file), or None."""
    for e in chain(err):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return (
                f"{os.strerror(e.errno)}: could not write {e.filename or 'a file'}; free space on its "
                "filesystem, or point that folder elsewhere (a symlink to a larger disk), then re-run "
                "the same command"
            )
    return None


# What a file system says to a user who may not write somewhere (or finds a file where a folder
# should be): the last resort of the CLI's one-line errors for an OSError no check caught first.
REFUSALS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR)


def refused_write(err: BaseException) -> str | None:
    """One line for an OSError of ``REFUSALS`` anywhere in err's chain (naming its path), or None."""
    for e in chain(err):
        if isinstance(e, OSError) and e.errno in (errno.EISDIR, errno.ENOTDIR) and e.filename:
            if e.errno == errno.EISDIR:
                return f"{e.filename}: is a folder where a file goes: move it aside or remove it, then re-run"
            return (
                f"{e.filename}: {os.strerror(e.errno)} (a file stands where a folder of this path goes): "
                "move that file aside or remove it, then re-run"
            )
        if isinstance(e, OSError) and e.errno in REFUSALS:
            path = e.filename or "a file"
            return (
                f"{path}: {os.strerror(e.errno)}: make it writable by this user (`sudo chown -R "
                f"{_user(os.geteuid())} {path}` if a `sudo` run left it), then re-run the same command"
            )
    return None
