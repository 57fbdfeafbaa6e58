"""The tracking store's faults: an unreachable server fails the stage fast, before training; two
first runs at once create a new sqlite store once; a store or artifact root this user cannot
write, or a folder in the store's place, is one line naming the path and the fix, in seconds,
before any training, in every stage that opens the store (train, evaluate, compare, bench).

Root ignores permission bits, so the unwritable cases run their stage as the user nobody
(``setpriv``), in a project that user owns but for the file or folder under test; where that
cannot be done the test says so in its skip reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ampbench.tracking import store
from conftest import (
    SINGLE,
    clean_env,
    free_port,
    mlflow_client,
    new_project,
    run_cli,
    runs,
    stage_log,
    venv_env,
    wait_exit,
)


@pytest.mark.slow  # `python -m ampbench` subprocesses: ~2 s each for the imports
def test_unreachable_tracking_server_fails_fast_before_training(project):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli(project, *SINGLE, env=venv_env(MLFLOW_TRACKING_URI=uri), check=False, timeout=120)
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 1
    assert f"MLflow tracking server {uri} is not answering" in proc.stderr
    assert "MLFLOW_TRACKING_URI" in proc.stderr
    assert not (project / "models").exists() and not (project / "checkpoints").exists()


@pytest.mark.slow
def test_two_first_runs_at_once_create_the_store_once(tmp_path, procs):
    """`dvc queue start -j 2` or two terminals: both first runs migrating a new sqlite store raced."""
    project = new_project(tmp_path / "p")
    started = [
        procs.start(project, "train", "--parallel", "single", "--precision", p, name=p)
        for p in ("fp32", "autocast")
    ]
    for proc, name in zip(started, ("fp32", "autocast")):
        assert wait_exit(proc, 240, project / f"{name}.log") == 0, stage_log(project, name)
    finished = [r for r in runs(project) if r.info.status == "FINISHED"]
    assert sorted(r.info.run_name for r in finished) == [
        "single-autocast",
        "single-autocast/seed-0",
        "single-fp32",
        "single-fp32/seed-0",
    ]
    run_cli(project, *SINGLE, "--set", "train.seeds=[1]")  # the store stays usable
    assert len(runs(project, kind="seed")) == 3


NOBODY = 65534  # the unprivileged user of Linux distributions
BOUND_S = 30  # no fault may keep the user waiting longer without a line
STAGES = {
    "train": SINGLE,
    "evaluate": ("evaluate", "--parallel", "single", "--precision", "fp32"),
    "compare": ("compare", "--variants", "single-fp32"),  # reaches the store before any report
    "bench": (
        "bench",
        "--variants",
        "single-fp32",
        "--steps",
        "1",
        "--windows",
        "1",
        "--warmup",
        "0",
        "--workers",
        "0",
        "--max-images",
        "20",
        "--out",
        "reports/bench",
    ),
}


@pytest.fixture
def shared_project():
    """A tiny project the user nobody can reach (tmp_path's parents are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="ampbench-store-faults-"))
    folder.chmod(0o755)
    try:
        yield new_project(folder / "proj")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_nobody(project: Path) -> list[str]:
    """The command prefix that runs a stage as nobody, who then owns the project; skips, saying
    why, where that is impossible (not root, no setpriv, a venv nobody cannot read)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the project to another user (nobody) and run the stage as that user")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: no way to run the stage as another user")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import ampbench, mlflow"],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run this venv's python: {probe.stderr.strip()[-300:]}")
    for path in (project, *project.rglob("*")):
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return prefix


def run_stage(project: Path, stage: str, prefix: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """The stage as `prefix` runs it (a user), with its wall time."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "ampbench", *STAGES[stage]],
        cwd=project,
        env=clean_env(HOME=str(project)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc, time.monotonic() - t0


def assert_one_line(proc: subprocess.CompletedProcess, seconds: float, *needles: str) -> str:
    """Exit 1 within the bound, one error line holding every needle, and no traceback."""
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert proc.returncode == 1 and len(errors) == 1, output
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert seconds < BOUND_S, f"{seconds:.0f} s: {output}"
    return errors[0]


def store_left_by_sudo(project: Path) -> list[str]:
    """After `sudo make run`: the study's experiment in a store whose files root owns."""
    mlflow_client(project).create_experiment("cifar10-amp", (project / "mlruns").as_uri())
    (project / "mlflow.db.lock").touch()
    prefix = as_nobody(project)
    for name in ("mlflow.db", "mlflow.db.lock"):
        os.chown(project / name, 0, 0)
    db = project / "mlflow.db"
    return [prefix, f"{db} belongs to root, not to nobody", f"`sudo chown nobody {db} {db}.lock`"]


def read_only_store(project: Path) -> list[str]:
    """mlflow.db of the user's own, chmod 0444 (as nobody when root: root writes it anyway)."""
    prefix = as_nobody(project) if os.geteuid() == 0 else []
    db = project / "mlflow.db"
    db.chmod(0o444)
    return [prefix, f"{db} is read-only (mode 0444)", f"`chmod u+w {db}`"]


def store_is_a_folder(project: Path) -> list[str]:
    db = project / "mlflow.db"
    db.unlink()
    db.mkdir()
    return [[], f"{db} is a folder, not a database file", f"`mv {db} {db}.folder`"]


def artifact_root_is_a_file(project: Path) -> list[str]:
    root = project / "mlruns"
    root.write_text("not a folder")
    return [
        [],
        f"MLflow artifact root {root} ",
        f"({root} is a file)",
        "make it a folder this user can write",
    ]


def artifact_root_of_root(project: Path) -> list[str]:
    """mlruns/ left by a `sudo` run: a folder nobody cannot write into."""
    prefix = as_nobody(project)
    root = project / "mlruns"
    root.mkdir()
    os.chown(root, 0, 0)
    return [
        prefix,
        f"MLflow artifact root {root} ",
        "(Permission denied)",
        "make it a folder this user can write",
    ]


def store_folder_of_root(project: Path) -> list[str]:
    """A store the user owns, used before (its lock file there too), in a folder root owns: sqlite
    cannot create its journal beside it."""
    (project / "mlflow.db.lock").touch()
    prefix = as_nobody(project)
    os.chown(project, 0, 0)
    return [prefix, f"its folder {project} cannot take new files (Permission denied)", "journal"]


FAULTS = {
    "store left by sudo": store_left_by_sudo,
    "read-only store": read_only_store,
    "store is a folder": store_is_a_folder,
    "artifact root is a file": artifact_root_is_a_file,
    "artifact root of root": artifact_root_of_root,
}


@pytest.mark.slow  # stages as subprocesses
@pytest.mark.parametrize("fault", FAULTS)
def test_an_unusable_store_stops_train_in_one_line_before_training(shared_project, fault):
    """Issue #36: a sudo-owned mlflow.db printed 91 lines and two tracebacks, a read-only artifact
    root was a traceback (exit 70 warm), mlflow.db a folder took 105 s of retries and a wrong fix."""
    prefix, *needles = FAULTS[fault](shared_project)
    proc, seconds = run_stage(shared_project, "train", prefix)
    assert_one_line(proc, seconds, *needles)
    assert len((proc.stdout + proc.stderr).strip().splitlines()) == 1, proc.stderr
    assert not (shared_project / "models").exists()  # refused before training
    if (shared_project / "mlflow.db").is_file():
        assert runs(shared_project) == []  # and before any run was created


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["evaluate", "compare", "bench"])
@pytest.mark.parametrize("fault", ["store left by sudo", "store is a folder", "artifact root is a file"])
def test_the_other_stages_say_it_in_one_line(shared_project, fault, stage):
    """evaluate and compare check the store before any work; bench measures first (its results
    never depend on the store), writes them, then says in one line that they are not recorded."""
    prefix, *needles = FAULTS[fault](shared_project)
    proc, seconds = run_stage(shared_project, stage, prefix)
    line = assert_one_line(proc, seconds, *needles)
    if stage == "bench":
        assert "bench not recorded in MLflow" in line and (shared_project / "reports/bench.json").exists()


@pytest.mark.slow
def test_a_store_folder_without_room_for_a_journal_is_one_line(shared_project):
    """evaluate, whose first write is the store's (train would first refuse models/ there)."""
    prefix, *needles = store_folder_of_root(shared_project)
    proc, seconds = run_stage(shared_project, "evaluate", prefix)
    assert_one_line(proc, seconds, *needles)


def test_a_store_turned_read_only_mid_run_is_named_with_its_fix(tmp_path):
    """After the stage's check (the files changed under it): sqlite's own words, under MLflow's
    wrapper, still give the store, its folder and the fix rather than "Query-invoked autoflush"."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    try:
        try:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        except sqlite3.OperationalError as inner:
            raise MlflowException("(raised as a result of Query-invoked autoflush; ...)") from inner
    except MlflowException as err:
        line = store.store_fault(err, uri)
    assert line is not None and "\n" not in str(line)
    assert f"MLflow store {uri} cannot be written (sqlite: attempt to write a readonly database)" in str(line)
    assert f"make {db} and its folder {tmp_path} writable by this user" in str(line)


def test_a_store_of_no_known_scheme_is_named_so_without_a_cut_list():
    """Hostile re-run: MLFLOW_TRACKING_URI=bogus://x quoted MLflow's exception cut mid-word ("...
    Supported URI schemes are: ['', 'file', 'datab)") and said only "check the store"."""
    from mlflow.tracking import MlflowClient

    from ampbench.tracking import faults

    with pytest.raises(Exception) as err:
        MlflowClient(tracking_uri="bogus://x").search_experiments()
    line = faults.describe(err.value, "bogus://x", None)
    assert line and line.startswith("MLflow store bogus://x: not a kind of store MLflow knows ("), line
    assert "set MLFLOW_TRACKING_URI to sqlite:///<path>.db" in line and "Supported URI schemes" not in line


def test_a_folder_as_the_store_is_named_with_its_fixes(tmp_path, monkeypatch):
    """Final pass J: MLFLOW_TRACKING_URI=<a folder> quoted MLflow's "maintenance mode" text cut
    mid-word ("... Please migrate to a database backend (e.g., 'sqlite:///mlflow.db') to a"), then
    "check the store"."""
    from mlflow.tracking import MlflowClient

    from ampbench.tracking import faults

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    # hostile pass WARN: a file:// URI of a folder not there yet was said to be "a folder"
    for uri in (str(tmp_path), (tmp_path / "not-yet").as_uri()):
        with pytest.raises(Exception) as err:
            MlflowClient(tracking_uri=uri).search_experiments()
        line = faults.describe(err.value, uri, None)
        assert line == (
            f"MLflow store {uri} names a folder store (MLflow's folder store is in maintenance mode); "
            f"{faults.SCHEMES}, or MLFLOW_ALLOW_FILE_STORE=true"
        ), line


@pytest.mark.parametrize("uri", ["postgresql://u@127.0.0.1:1/x", "mysql+mysqldb://u@127.0.0.1/x"])
def test_a_database_store_without_its_driver_is_one_line(uri):
    """Final pass L: a 66-line traceback ending "ModuleNotFoundError: No module named 'psycopg'"."""
    from ampbench.tracking import store

    try:
        try:
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        except ModuleNotFoundError as missing:
            raise RuntimeError("the store could not be opened") from missing
    except RuntimeError as err:
        line = str(store.store_fault(err, uri))
    assert line.startswith(f"MLflow store {uri} needs the database driver 'psycopg', which is not installed")
    assert store.store_fault(ModuleNotFoundError("x", name="x"), "sqlite:///mlflow.db") is None


@pytest.mark.parametrize("code", [401, 403])
def test_a_server_that_asks_for_a_login_is_told_with_the_variables_that_give_one(code):
    """Hostile pass L: a tracking server behind basic-auth (RELIABILITY's own advice for an exposed
    UI) answered 401, and the line said "see the server's log; then re-run the same command",
    which fails the same way every time."""
    import http.server
    import threading

    from mlflow.tracking import MlflowClient

    from ampbench.tracking import faults

    class Login(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = b"You are not authenticated. Please see the documentation on authentication."
            self.send_response(code)
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Login)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(Exception) as err:
            MlflowClient(tracking_uri=uri).search_experiments()
    finally:
        httpd.shutdown()
    line = faults.describe(err.value, uri, None)
    assert line.startswith(f"MLflow tracking server {uri} refused this user (error code {code}"), line
    assert "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)" in line


def test_a_store_under_a_file_is_refused_with_a_fix_that_works(tmp_path):
    """Hostile pass I: sqlite:////etc/passwd/x.db said "refuses writes (Not a directory): make
    /etc/passwd/x.db writable by this user", which no one can."""
    from ampbench.tracking import store

    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    for db in (tmp_path / "notes.txt" / "mlflow.db", tmp_path / "notes.txt" / "sub" / "mlflow.db"):
        with pytest.raises(store.TrackingError) as err:
            store.check_sqlite_store(f"sqlite:///{db}")
        assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in str(err.value)
        assert "point MLFLOW_TRACKING_URI at a path in a folder" in str(err.value)


def test_a_host_that_does_not_resolve_is_no_server_to_start_and_long_reasons_end_on_a_word():
    """Hostile pass I: `MLFLOW_TRACKING_URI=http://` said "not answering (Name or service not
    known): start it again"; `databricks`'s reason ended mid-word ("the tracking URI is set co")."""
    from ampbench.tracking import faults

    class MlflowException(Exception):  # classified by its package's name, as MLflow's own
        __module__ = "mlflow.exceptions"

    line = faults.describe(MlflowException("Max retries: Name or service not known"), "http://", None)
    assert line and "(Name or service not known): its host name is unknown: fix or unset" in line
    assert "start it again" not in line
    long = "Reading credentials failed. Please ensure that the library is installed, the URI is set " * 3
    line = faults.describe(MlflowException(long), "databricks", None)
    assert line
    reason = line.split(" failed (", 1)[1].split("); check", 1)[0]
    assert reason.endswith(" ...") and len(reason) <= 204
    assert f"MlflowException: {long}".startswith(reason.removesuffix(" ...") + " ")  # whole words
