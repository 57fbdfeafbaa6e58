"""Faults of the world around a stage: a broken MLflow store, a full disk, a corrupt archive, and
what a user or a batch system does to the process (affinity, nice, limits, cgroups, closed stdin,
SIGHUP under nohup, SIGSTOP, kill -9). docs/RELIABILITY.md maps each case to its test here.

A stage is the process the user launched: these tests start `python -m ampbench ...` (through
`sh -c ... exec`, `nohup` or `taskset` where the case needs them) and look at that very process
through psutil (in /proc for what psutil does not read: ignored signals, the cgroup). Cases that
need root (a small tmpfs, a cgroup) are skipped with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest
import torch

from ampbench import cli
from ampbench.checkpoints import files
from ampbench.checkpoints.state import SeedCheckpoint
from ampbench.data import extract, fetch
from ampbench.tracking import store
from conftest import (
    LONG_EPOCHS,
    VENV_BIN,
    alive,
    cgroup2_root,
    descendants,
    empty_store,
    free_port,
    image_folder_archive,
    load_pt,
    long_project,
    mlflow_client,
    runs,
    small_tmpfs,
    venv_env,
    wait_for_checkpoint,
)

PY = sys.executable
TRAIN = ("train", "--parallel", "single", "--precision", "fp32")
WORK0 = Path("checkpoints/single-fp32/seed-0")
SEED0 = Path("models/single-fp32/seed-0/model.pt")


# ---------------------------------------------------------------- helpers
def _uri(project: Path) -> str:
    return f"sqlite:///{project.resolve() / 'mlflow.db'}"


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


def _assert_one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 1, no traceback, exactly one ERROR line, holding every needle; returns the line."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = _errors(out)
    assert len(errors) == 1, out[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _cli(project: Path, *args: str, env: dict | None = None, timeout: float = 240):
    return subprocess.run(
        [PY, "-m", "ampbench", *args],
        cwd=project,
        env=env or venv_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _in_folder(project: Path) -> list[int]:
    """Live processes (ours excepted) whose working folder is the project: a stage, or an orphan."""
    found = []
    for process in psutil.process_iter(["cwd"]):
        pid, cwd = process.pid, process.info["cwd"]
        if pid != os.getpid() and cwd and alive(pid) and Path(cwd) == project.resolve():
            found.append(pid)
    return found


def _fill(folder: Path) -> None:
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
        while True:
            f.write(b"\0" * (1 << 16))
            f.flush()


# ---------------------------------------------------------------- 1. the MLflow store
@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> bytes:
    """The bytes of a valid, migrated sqlite MLflow store with the study's experiment."""
    folder = tmp_path_factory.mktemp("store")
    empty_store(folder / "mlflow.db")  # migrated once per session (conftest)
    mlflow_client(folder).create_experiment("cifar10-amp")
    return (folder / "mlflow.db").read_bytes()


@contextlib.contextmanager
def _broken(project: Path, fault: str, good: bytes):
    """Break the project's store; yields (env, the words the error line must hold)."""
    db = project / "mlflow.db"
    if fault == "server-gone":
        uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        # (the stages' preflight says "is not usable (connection refused). Start the server, ...")
        yield venv_env(MLFLOW_TRACKING_URI=uri), [uri, "(connection refused)", "MLFLOW_TRACKING_URI"]
        return
    db.write_bytes(good)
    needles = [_uri(project), "re-run the same command"]
    if fault == "random-bytes":
        db.write_bytes(os.urandom(len(good)))
        yield venv_env(), [*needles, "is corrupt", "mv "]
    elif fault == "truncated":
        db.write_bytes(good[: len(good) // 3])
        yield venv_env(), [*needles, "is corrupt"]
    else:  # another process holds an exclusive sqlite lock (here: this one, through sqlite3)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            yield venv_env(), [*needles, "is locked by", f"pid {os.getpid()}"]
        finally:
            holder.close()


STORE_STAGES = {
    "train": TRAIN,
    "evaluate": ("evaluate", "--parallel", "single", "--precision", "fp32"),
    "compare": ("compare", "--variants", "single-fp32"),
}


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STORE_STAGES))
@pytest.mark.parametrize("fault", ["server-gone", "random-bytes", "truncated", "locked"])
def test_every_store_fault_is_one_line_in_every_stage(project, good_store, fault, stage):
    with _broken(project, fault, good_store) as (env, needles):
        t0 = time.monotonic()
        proc = _cli(project, *STORE_STAGES[stage], env=env)
        took = time.monotonic() - t0
    _assert_one_line(proc, *needles)
    assert took < 45, f"{took:.0f} s"  # the lock wait is sqlite's 5 s, never minutes
    assert not (project / "checkpoints").exists() and not (project / "models").exists()
    assert not (project / "reports").exists()


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["--debug", "AMPBENCH_DEBUG=1"])
def test_debug_switch_shows_the_traceback_of_a_store_fault(project, good_store, switch):
    with _broken(project, "random-bytes", good_store) as (env, _):
        flag = [switch] if switch.startswith("--") else []
        if not flag:
            env = {**env, "AMPBENCH_DEBUG": "1"}
        proc = _cli(project, *STORE_STAGES["compare"], *flag, env=env)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "file is not a database" in proc.stderr


@pytest.mark.slow
def test_bench_and_download_outlive_a_broken_store(project, good_store, tmp_path):
    """bench says at once that the store fails, measures anyway, keeps its results (one error
    line, exit 1); download never opens the store."""
    archive = image_folder_archive(tmp_path)
    with _broken(project, "locked", good_store) as (env, needles):
        bench = _cli(project, "bench", "--variants", "single-fp32", "--steps", "1", "--windows", "1",
                     "--warmup", "0", "--workers", "0", "--max-images", "40", env=env)  # fmt: skip
        download = _cli(project, "download", "--set", f"data.url={archive}", env=env)
    assert bench.returncode == 1, bench.stderr[-3000:]
    warnings = [line for line in bench.stderr.splitlines() if "recorded in MLflow" in line]
    assert len(warnings) == 2 and all("is locked by" in line for line in warnings), bench.stderr[-3000:]
    assert "will not be recorded in MLflow" in warnings[0] and "Measuring anyway" in warnings[0]
    assert "ERROR" in warnings[1] and "bench not recorded in MLflow" in warnings[1]
    assert "Traceback" not in bench.stderr
    assert (project / "reports" / "bench.json").exists()
    assert download.returncode == 0, download.stderr[-3000:]


KILL_AFTER_PREFLIGHT = """
import os, signal
if os.environ.get("AMPBENCH_TEST_KILL_PGID"):  # kill the MLflow server once the stage checked it
    from ampbench.tracking import tracker
    _preflight = tracker.Tracker.preflight
    def preflight(self):
        _preflight(self)
        os.killpg(int(os.environ["AMPBENCH_TEST_KILL_PGID"]), signal.SIGKILL)
    tracker.Tracker.preflight = preflight
"""


@contextlib.contextmanager
def _server(folder: Path):
    """`mlflow server` in a process group of its own (so that one killpg ends it and its workers)."""
    port = free_port()
    server = subprocess.Popen(
        [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
         "--artifacts-destination", str(folder / "artifacts")],
        cwd=folder, env=venv_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5),
            ):
                break
            assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)
        yield server, f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)


@pytest.mark.slow
def test_tracking_server_killed_during_evaluate_is_one_line(project, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AFTER_PREFLIGHT)
    with _server(tmp_path) as (server, uri):
        fast = ("--set", "tracking.request_timeout_s=2")
        trained = _cli(project, *TRAIN, *fast, env=venv_env(MLFLOW_TRACKING_URI=uri))
        assert trained.returncode == 0, trained.stderr[-3000:]
        pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
        env = venv_env(
            MLFLOW_TRACKING_URI=uri, PYTHONPATH=pythonpath, AMPBENCH_TEST_KILL_PGID=str(server.pid)
        )
        t0 = time.monotonic()
        proc = _cli(project, *STORE_STAGES["evaluate"], *fast, env=env)
        assert server.wait(10) is not None  # the hook did kill it mid-stage
    _assert_one_line(proc, f"MLflow tracking server {uri} is not answering", "re-run the same command")
    assert time.monotonic() - t0 < 90


def test_store_faults_are_classified_without_a_traceback(project, monkeypatch, caplog):
    """The CLI's one place: store and disk faults from any stage become one line, bugs stay loud."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    locked = sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))
    gone = MlflowException("API request to http://h:1/api/2.0/mlflow/runs/get failed with exception "
                           "HTTPConnectionPool(host='h', port=1): Max retries exceeded (Caused by "
                           "NewConnectionError('Failed to establish a new connection: [Errno 111] "
                           "Connection refused'))")  # fmt: skip
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "reports/metrics/x.json")
    cases = [(locked, "is locked by"), (gone, "is not answering (connection refused)"),
             (full, "No space left on device: could not write reports/metrics/x.json")]  # fmt: skip
    monkeypatch.chdir(project)
    monkeypatch.delenv("AMPBENCH_DEBUG", raising=False)
    for err, words in cases:

        def fail(*_, err=err):
            raise err

        module = types.SimpleNamespace(main=fail)
        monkeypatch.setattr(cli, "command_module", lambda name, module=module: module)
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert cli.main(["compare"]) == 1
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(lines) == 1 and words in lines[0] and "\n" not in lines[0], lines
    monkeypatch.setattr(cli, "command_module", lambda name: types.SimpleNamespace(main=lambda *_: 1 / 0))
    with pytest.raises(ZeroDivisionError):  # not a store fault: a bug keeps its traceback
        cli.main(["compare"])
    monkeypatch.setenv("AMPBENCH_DEBUG", "1")
    monkeypatch.setattr(
        cli,
        "command_module",
        lambda name: types.SimpleNamespace(main=lambda *_: (_ for _ in ()).throw(locked)),
    )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        cli.main(["compare"])


def test_a_stuck_store_lock_is_an_error_naming_its_holder(tmp_path, caplog):
    """Said while it waits (hostile re-run: 36.6 s without a line), then an error naming it."""
    db = tmp_path / "mlflow.db"
    holder = subprocess.Popen(
        [PY, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)", f"{db}.lock"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        busy = pytest.raises(store.TrackingError, match=rf"is busy: .* by pid {holder.pid} \(python")
        with (
            caplog.at_level("INFO", logger=store.__name__),
            busy,
            store.store_lock(f"sqlite:///{db}", timeout_s=0.5),
        ):
            pass
        assert time.monotonic() - t0 < 5
        said = [r.getMessage() for r in caplog.records if r.name == store.__name__]
        assert len(said) == 1 and said[0].startswith(f"waiting for {db}.lock, held by pid {holder.pid}"), said
    finally:
        holder.kill()
        holder.wait()
    with store.store_lock(f"sqlite:///{db}", timeout_s=0.5):  # free again once its holder is gone
        pass


# ---------------------------------------------------------------- 2. a full disk
def test_torch_writer_on_a_full_filesystem_says_no_space_and_keeps_the_checkpoint(tmp_path):
    """torch.save's own zip writer fails with `unexpected pos` and no errno on a real full disk."""
    with small_tmpfs(tmp_path / "small", "512k") as small:
        path = small / "checkpoint.pt"
        files.save({"epoch": 1}, path)
        before = path.read_bytes()
        with pytest.raises(files.CheckpointError) as err:
            files.save({"epoch": 2, "w": torch.zeros(300_000)}, path)  # 1.2 MB
        text = str(err.value)
        assert text.startswith(f"No space left on device: could not write checkpoint {path}"), text
        assert "free space" in text and "elsewhere" in text and "\n" not in text
        assert "inline_container" in repr(err.value.__cause__.__cause__)  # what torch itself said
        assert path.read_bytes() == before
        assert sorted(os.listdir(small)) == ["checkpoint.pt"]  # no partial temp file


@pytest.mark.slow
def test_checkpoints_on_a_filling_filesystem_fail_in_one_line_and_resume(tmp_path, procs):
    """`checkpoints/` on a small filesystem: the first checkpoint (~18 MB) fits, the second not."""
    project = long_project(tmp_path / "p")
    with small_tmpfs(tmp_path / "small", "26m") as small:
        (project / "checkpoints").symlink_to(small)
        proc = _cli(project, *TRAIN)
        _assert_one_line(proc, "No space left on device: could not write checkpoint", "free space")
        kept = load_pt(project / WORK0 / "checkpoint.pt")
        assert kept["epoch"] >= 1
        assert not [p.name for p in small.rglob(".*tmp-*")]  # the partial temp file is gone
        run_id = kept["run_id"]
        assert mlflow_client(project).get_run(run_id).info.status == "FAILED"
        subprocess.run(["mount", "-o", "remount,size=200m", str(small)], check=True)
        again = _cli(project, *TRAIN)
        assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming seed 0" in again.stderr and f"run {run_id}" in again.stderr  # in the same run
    assert mlflow_client(project).get_run(run_id).info.status == "FINISHED"
    assert load_pt(project / SEED0)["run_id"] == run_id


def test_extraction_onto_a_full_filesystem_says_no_space_and_leaves_nothing(tmp_path, monkeypatch):
    """The disk fills while extracting (another writer took the space after the check of the free
    space, tests/data/test_download_bounds.py): the write's own failure is the same one line."""
    plenty = extract.Bound(2**40, "", False)
    ample = classmethod(lambda cls, folder: cls(folder, plenty, plenty, 4096))
    monkeypatch.setattr(extract.Room, "of", ample)
    archive = image_folder_archive(tmp_path)
    with small_tmpfs(tmp_path / "small", "64k") as small:
        with pytest.raises(fetch.DataError, match=r"^No space left on device: could not write .*free space"):
            fetch.safe_extract(archive, small / "extracted-x")
        assert os.listdir(small) == []


# ---------------------------------------------------------------- 3. corrupt archives
def _spoiled(archive: Path, how: str) -> Path:
    raw = bytearray(archive.read_bytes())
    if how == "bad-crc":
        raw[-8] ^= 0xFF  # the gzip trailer's CRC32 (tarfile never reads that far by itself)
    elif how == "flipped-byte":
        raw[len(raw) // 2] ^= 0x55  # tarfile used to stop at the garbled header, silently
    elif how == "truncated-gz":
        raw = raw[: len(raw) * 2 // 3]
    else:  # a plain tar cut at a block boundary: tarfile takes the cut for the end
        plain = gzip.decompress(bytes(raw))
        raw = plain[: len(plain) // 2 // 512 * 512]
    out = archive.with_name(f"{how}.tar" + ("" if how == "truncated-tar" else ".gz"))
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("how", ["bad-crc", "flipped-byte", "truncated-gz", "truncated-tar"])
def test_corrupt_archive_says_so_and_leaves_no_extraction(tmp_path, how):
    archive = _spoiled(image_folder_archive(tmp_path), how)
    raw = tmp_path / "raw"
    (raw / "extracted-x" / "train").mkdir(parents=True)  # an older extraction of the same source
    with pytest.raises(fetch.DataError) as err:
        fetch.safe_extract(archive, raw / "extracted-x")
    text = str(err.value)
    assert text.startswith(f"the archive {archive} is corrupt (CRC/checksum failure: "), text
    assert "re-download" in text
    assert os.listdir(raw) == []  # neither a partial nor a stale extraction is left


@pytest.mark.slow
def test_download_of_an_archive_with_a_bad_crc_is_one_line(project, tmp_path):
    archive = _spoiled(image_folder_archive(tmp_path), "bad-crc")
    tag = hashlib.sha256(str(archive).encode()).hexdigest()[:12]
    stale = project / "data" / "raw" / f"extracted-{tag}" / "train"
    stale.mkdir(parents=True)  # what an older version left: a partial extraction
    proc = _cli(project, "download", "--set", f"data.url={archive}")
    _assert_one_line(proc, f"the archive {archive} is corrupt (CRC/checksum failure", "re-download")
    assert "no data set found" not in proc.stderr
    assert not list((project / "data" / "raw").glob("*extracted-*"))


# ---------------------------------------------------------------- 4. the stage is the process
def _start(procs, project: Path, shell: str, name: str = "train", env: dict | None = None):
    """`sh -c "<shell> exec python -m ampbench train ..."`: the shell's pid becomes the stage's."""
    stage = " ".join([PY, "-m", "ampbench", *TRAIN])
    return procs.start(project, cmd=["sh", "-c", shell.format(stage=stage)], name=name, env=env)


def _training(proc, project: Path, min_epoch: int = 1) -> None:
    """Wait until the stage wrote an epoch checkpoint; assert it is the process that was started."""
    wait_for_checkpoint(proc, project / WORK0 / "checkpoint.pt", project / "train.log", min_epoch)
    assert any("ampbench" in arg for arg in psutil.Process(proc.pid).cmdline())
    assert descendants(proc.pid) == []  # nothing trains in a child: the stage is this process


def _finished(proc, project: Path, timeout: float = 240) -> None:
    assert proc.wait(timeout) == 0, (project / "train.log").read_text()[-3000:]
    assert (project / SEED0).exists()
    seeds = runs(project, kind="seed")
    assert [r.info.status for r in seeds] == ["FINISHED"], [r.info.status for r in seeds]


@pytest.mark.slow
def test_affinity_nice_and_open_file_limit_are_the_launchers(tmp_path, procs):
    project = long_project(tmp_path / "p")
    proc = procs.start(
        project, cmd=["taskset", "-c", "0", "nice", "-n", "10", "sh", "-c",
                      f"ulimit -n 512 && exec {PY} -m ampbench {' '.join(TRAIN)}"],
    )  # fmt: skip
    _training(proc, project)
    stage = psutil.Process(proc.pid)
    assert stage.cpu_affinity() == [0]
    assert stage.nice() == min(os.nice(0) + 10, 19)  # nice -n 10 adds to the niceness pytest runs at
    assert stage.rlimit(psutil.RLIMIT_NOFILE)[0] == 512  # the soft limit: what the stage may open
    _finished(proc, project)


def _cgroup2_root() -> Path:
    root = cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted here")
    return root


@pytest.mark.slow
def test_the_stage_runs_in_the_launchers_cgroup_and_ends_with_it(tmp_path, procs):
    """The SLURM case: a job's cgroup holds its stage, and ending the job (killing the cgroup) ends it."""
    group = _cgroup2_root() / f"ampbench-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a cgroup under {group.parent}: {err.strerror}")
    try:
        project = long_project(tmp_path / "p")
        proc = _start(procs, project, f"echo $$ > {group}/cgroup.procs && exec {{stage}}")
        _training(proc, project)
        assert f"0::/{group.name}\n" in Path(f"/proc/{proc.pid}/cgroup").read_text()
        for pid in (group / "cgroup.procs").read_text().split():  # end the job: all of its cgroup
            os.kill(int(pid), signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        time.sleep(0.5)
        assert _in_folder(project) == []  # nothing of the stage lives on outside the cgroup
        assert load_pt(project / WORK0 / "checkpoint.pt")["epoch"] >= 1
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


@pytest.mark.slow
def test_closed_stdin_then_kill_9_leaves_no_orphan_and_resumes(tmp_path, procs):
    project = long_project(tmp_path / "p")
    proc = _start(procs, project, "exec {stage} <&-")
    _training(proc, project)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    checkpoint = project / WORK0 / "checkpoint.pt"
    before = checkpoint.stat().st_mtime_ns
    time.sleep(2)
    assert _in_folder(project) == []  # no orphan trains on
    assert checkpoint.stat().st_mtime_ns == before
    again = _start(procs, project, "exec {stage} <&-", name="train")
    _finished(again, project)
    (seed,) = runs(project, kind="seed")
    steps = [m.step for m in mlflow_client(project).get_metric_history(seed.info.run_id, "train/loss")]
    assert len(set(steps)) == LONG_EPOCHS and len(steps) <= LONG_EPOCHS + 1, steps  # no second trainer


@pytest.mark.slow
def test_sighup_under_nohup_is_ignored_and_training_goes_on(tmp_path, procs):
    project = long_project(tmp_path / "p")
    proc = procs.start(project, cmd=["nohup", PY, "-m", "ampbench", *TRAIN])
    _training(proc, project)
    ignored = int(Path(f"/proc/{proc.pid}/status").read_text().split("SigIgn:\t")[1].split()[0], 16)
    assert ignored >> (signal.SIGHUP - 1) & 1  # nohup's SIG_IGN, kept: nothing re-arms SIGHUP
    os.kill(proc.pid, signal.SIGHUP)
    _finished(proc, project)
    assert "SIGHUP" not in (project / "train.log").read_text()


@pytest.mark.slow
def test_sigstop_stops_the_training_itself(tmp_path, procs):
    """Ctrl-Z / kill -STOP of the stage stops the training: no other process trains for it."""
    project = long_project(tmp_path / "p")
    proc = _start(procs, project, "exec {stage}")
    _training(proc, project)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "not stopped"
            time.sleep(0.05)
        checkpoint, log = project / WORK0 / "checkpoint.pt", project / "train.log"
        before = checkpoint.stat().st_mtime_ns, log.stat().st_size
        time.sleep(3)  # 3 epochs' time: a checkpoint a second while training
        assert (checkpoint.stat().st_mtime_ns, log.stat().st_size) == before
        assert _in_folder(project) == [proc.pid]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _finished(proc, project)


@pytest.mark.slow
@pytest.mark.parametrize("runtime_dir", ["full", "not-a-folder"])
def test_a_full_or_unusable_xdg_runtime_dir_changes_nothing(project, tmp_path, runtime_dir):
    if runtime_dir == "full":
        with small_tmpfs(tmp_path / "xdg", "64k") as xdg:
            _fill(xdg)
            assert shutil.disk_usage(xdg).free < 4096
            proc = _cli(project, *TRAIN, env=venv_env(XDG_RUNTIME_DIR=str(xdg)))
    else:
        (tmp_path / "xdg").write_text("a file where a folder should be")
        proc = _cli(project, *TRAIN, env=venv_env(XDG_RUNTIME_DIR=str(tmp_path / "xdg" / "run")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (project / SEED0).exists()


@pytest.mark.slow
def test_temp_files_of_a_killed_stage_do_not_survive_the_next_run(tmp_path, procs):
    project = long_project(tmp_path / "p")
    proc = _start(procs, project, "exec {stage}")
    _training(proc, project)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # What a kill inside a save leaves: its writer's temp files (the killed pid is in their names).
    left = [project / WORK0 / f".{name}.tmp-{proc.pid}" for name in ("checkpoint.pt", "model.pt")]
    for temp in left:
        temp.write_bytes(os.urandom(4096))
    again = _start(procs, project, "exec {stage}")
    _finished(again, project)
    strays = [p for p in project.rglob("*") if ".tmp-" in p.name or ".part-" in p.name]
    assert strays == []


def test_loading_a_checkpoint_removes_temp_files_of_dead_writers_only(tmp_path):
    path = tmp_path / "checkpoint.pt"
    files.save({"format": 1}, path)  # any readable file: its temps go before it is validated
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".checkpoint.pt.tmp-{dead.pid}"
    live = tmp_path / f".checkpoint.pt.tmp-{os.getppid()}"  # a running writer's (pytest's parent)
    for temp in (stale, live):
        temp.write_bytes(b"half a checkpoint")
    with pytest.raises(files.CheckpointError):
        SeedCheckpoint.load(path)  # format 1: refused, but the dead writer's temp is gone already
    assert not stale.exists() and live.exists()
