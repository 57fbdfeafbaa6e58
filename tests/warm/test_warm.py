"""Warm starts scoped to a command (``ampbench.warm``): a stage runs in a fork of the server that
the command started, only where its context equals the server's, and the server lives exactly as
long as that command. The pipeline's own run through it: tests/pipeline/test_pipeline.py.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import alive, cgroup2_root, long_project, new_project, venv_env, wait_for_checkpoint

pytestmark = pytest.mark.slow  # a server imports torch and MLflow: seconds

PY = sys.executable
TRAIN = ("train", "--parallel", "single", "--precision", "fp32")
# What ampbench.dvc_run does around DVC, with stdin to end it.
HOLD = """
import sys
from ampbench.warm import scope
with scope.serving() as folder:
    print(folder, flush=True)
    sys.stdin.read()
"""


class Command:
    """A command that holds a warm server, as `make run` does around `dvc repro`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [PY, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=venv_env()
        )
        self.folder = Path(self.proc.stdout.readline().decode().strip())
        deadline = time.monotonic() + 120
        # the socket, then its "ready" line (CI: the socket came a moment before the line did)
        while not ((self.folder / "socket").exists() and re.search(r"warm server \d+: ready", self.log())):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.log()
            time.sleep(0.1)
        self.server = int(re.search(r"warm server (\d+): ready", self.log())[1])
        self.env = venv_env(AMPBENCH_WARM_SOCKET=str(self.folder / "socket"), AMPBENCH_DEBUG="1")

    def log(self) -> str:
        return (self.folder / "server.log").read_text()

    def stage_pid(self, command: str, since: int, timeout: float = 30) -> int:
        """The pid of the child that runs `command`, from the log after offset `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(rf"pid (\d+) runs `ampbench {re.escape(command)}`", self.log()[since:])
            if found:
                return int(found[-1])
            time.sleep(0.05)
        pytest.fail(f"the server ran no `{command}`:\n{self.log()}")

    def start(
        self, project: Path, prefix: tuple = (), log: Path | None = None
    ) -> tuple[subprocess.Popen, int]:
        """`ampbench train ...` as a client of this server: the client, and its stage's pid."""
        since = len(self.log())
        with open(log or os.devnull, "w") as out:
            proc = subprocess.Popen(
                [*prefix, PY, "-m", "ampbench", *TRAIN],
                cwd=project,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return proc, self.stage_pid(" ".join(TRAIN), since, timeout=60)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)


@pytest.fixture(scope="module")
def command():
    held = Command()
    yield held
    held.end()


def _state(pid: int) -> str:
    return psutil.Process(pid).status()


def _wait_state(pids: list[int], ok, message: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not all(ok(_state(pid)) for pid in pids):
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def _ignored(pid: int) -> int:
    """The signals `pid` ignores, as a mask (psutil does not read signal dispositions)."""
    return int(Path(f"/proc/{pid}/status").read_text().split("SigIgn:\t")[1].split()[0], 16)


def test_a_stage_runs_in_a_fork_of_the_server_and_ends_as_itself(command, tmp_path):
    project = new_project(tmp_path / "p")
    since = len(command.log())
    proc = subprocess.run(
        [PY, "-m", "ampbench", *TRAIN], cwd=project, env=command.env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    command.stage_pid(" ".join(TRAIN), since)  # it ran in the server's child
    assert (project / "models/single-fp32/seed-0/model.pt").exists()
    assert "test accuracy" in proc.stderr and "running here" not in proc.stderr
    # a usage error comes back as it would from a process of its own: message and status 2
    bad = subprocess.run(
        [PY, "-m", "ampbench", "compare", "--nope"], env=command.env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unrecognized arguments: --nope" in bad.stderr


def _limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))


def _affinity():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _cgroup_child() -> Path:
    root = cgroup2_root()
    if root is None or os.geteuid() != 0:
        pytest.skip("a cgroup of our own needs root and a cgroup v2 hierarchy")
    group = Path(root) / f"ampbench-warm-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a cgroup under {root}: {err.strerror}")
    return group


@pytest.mark.parametrize(
    "case, said",
    [
        ("environment", "environment variable PYTHONHASHSEED ('7' here, unset in the server)"),
        ("limit", "resource limit RLIMIT_NOFILE"),
        ("affinity", "CPU affinity"),
        ("nice", "nice value"),
        ("cgroup", "cgroup"),
    ],
)
def test_a_stage_in_another_context_runs_plain(command, case, said):
    """Another import-time environment, resource limit, CPU affinity, priority or cgroup: the
    stage runs in its own process, and the refusal says why."""
    env, preexec, group = dict(command.env), None, None
    if case == "environment":
        env["PYTHONHASHSEED"] = "7"
    elif case == "affinity" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here: no other affinity to try")
    elif case == "cgroup":
        group = _cgroup_child()
    preexec = {"limit": _limit, "affinity": _affinity, "nice": lambda: os.nice(1)}.get(case)
    if group is not None:
        preexec = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
    try:
        proc = subprocess.run(
            [PY, "-m", "ampbench", "compare", "--params", "nope.yaml"],
            env=env,
            preexec_fn=preexec,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if group is not None:
            group.rmdir()
    assert proc.returncode == 2 and "nope.yaml: not found" in proc.stderr, proc.stderr
    assert f"running here, not in the warm server: {said}" in proc.stderr
    assert said in command.log().splitlines()[-1]


@pytest.mark.serial  # job control under 2 loaded workers missed its 10 s window in CI: alone
@pytest.mark.xfail(
    strict=False,
    reason="order-dependent, under investigation: in a fresh clone's serial run after the other "
    "serial tests, Ctrl-Z left the stage or client unstopped for 10 s; it passes run alone",
)
def test_signals_reach_the_stage_once_nohup_and_job_control_hold(command, tmp_path):
    """nohup's ignored SIGHUP is the stage's too; Ctrl-Z stops and fg resumes it; one SIGTERM to
    the client is one SIGTERM to the stage: it saves, says how to resume, exits 143."""
    # long enough to outlive the signals below however fast the machine (it ends by the SIGTERM)
    project = long_project(tmp_path / "p", epochs=60)
    proc, stage = command.start(project, ("nohup",), project / "train.log")
    try:
        wait_for_checkpoint(
            proc, project / "checkpoints/single-fp32/seed-0/checkpoint.pt", project / "train.log"
        )
        assert _ignored(stage) >> (signal.SIGHUP - 1) & 1
        os.kill(proc.pid, signal.SIGTSTP)
        # as a shell does: fg only once the whole job (client and stage) is stopped
        _wait_state(
            [stage, proc.pid],
            lambda state: state == psutil.STATUS_STOPPED,
            "Ctrl-Z did not stop the stage and client",
        )
        os.kill(proc.pid, signal.SIGCONT)
        _wait_state([stage], lambda state: state != psutil.STATUS_STOPPED, "fg did not continue the stage")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(120) == 143, (project / "train.log").read_text()[-3000:]
    finally:
        proc.kill()
    text = (project / "train.log").read_text()
    assert "SIGTERM received" in text and "To resume" in text and text.count("SIGTERM received") == 1


def test_kill_9_of_the_client_ends_its_stage(command, tmp_path):
    project = long_project(tmp_path / "p", epochs=50)
    proc, stage = command.start(project)
    time.sleep(1)
    # named after its command in ps -e, top and pgrep (its command line stays the server's)
    assert psutil.Process(stage).name() == "ampbench-train"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(stage):
        assert time.monotonic() < deadline, "the stage outlived its client"
        time.sleep(0.05)


def test_the_server_is_gone_with_its_command():
    """Ended normally, its folder is removed; killed outright (kill -9), the server follows."""
    for ending in ("end", "kill"):
        held = Command()
        held.proc.kill() if ending == "kill" else held.end()
        held.proc.wait(30)
        deadline = time.monotonic() + 30
        while alive(held.server):
            assert time.monotonic() < deadline, f"the server outlived its command ({ending})"
            time.sleep(0.1)
        assert ending == "kill" or not held.folder.exists()


@pytest.mark.parametrize(
    "sig, statuses", [(signal.SIGINT, {130}), (signal.SIGHUP, {-signal.SIGHUP, 128 + signal.SIGHUP})]
)
def test_a_signal_at_the_stages_first_instant_is_not_lost(command, tmp_path, sig, statuses):
    """Sent as soon as the server forked: held until the stage has its own handlers, then acted
    on as a plain process would (Ctrl-C: a stop, 130; SIGHUP: its default, death, before the
    train stage's stop handler is set, a stop, 129, after). Lost, the stage would train on."""
    project = long_project(tmp_path / "p", epochs=50)
    for attempt in range(3):
        proc, _ = command.start(project)
        os.kill(proc.pid, sig)
        assert proc.wait(60) in statuses, f"attempt {attempt}"


def _training(held: Command, tmp_path: Path) -> tuple[Path, subprocess.Popen, int]:
    """A long train stage of `held`'s server, past its first checkpoint: project, client, stage."""
    project = long_project(tmp_path / "p", epochs=50)
    proc, stage = held.start(project, log=project / "train.log")
    wait_for_checkpoint(proc, project / "checkpoints/single-fp32/seed-0/checkpoint.pt", project / "train.log")
    return project, proc, stage


def test_a_sigterm_to_the_whole_job_stops_the_stage_once(tmp_path):
    """systemctl stop / scancel: SIGTERM to the client, the server and the stage at once. The stage
    saves and says how to resume, as a plain one would; the server goes on serving nobody new."""
    held = Command()
    try:
        project, proc, stage = _training(held, tmp_path)
        for pid in (proc.pid, held.server, stage):
            os.kill(pid, signal.SIGTERM)
        assert proc.wait(120) == 143, (project / "train.log").read_text()[-3000:]
        text = (project / "train.log").read_text()
        assert text.count("SIGTERM received") == 1 and "To resume" in text
    finally:
        held.end()


def test_the_command_killed_outright_stops_its_warm_stage_as_sigterm_does(tmp_path):
    """Hostile pass O: kill -9 of `python -m ampbench.dvc_run repro` mid-stage. The server's
    death-of-parent signal was SIGTERM, which it takes for a SIGTERM to the whole job (the stages
    have theirs already), so it sent none: the stage trained on as an orphan, published its models
    after the kill, and a re-run was refused as a second trainer."""
    from conftest import runs

    held = Command()
    try:
        project, proc, stage = _training(held, tmp_path)
        held.proc.kill()
        assert proc.wait(120) == 128 + signal.SIGTERM, (project / "train.log").read_text()[-3000:]
        said = (project / "train.log").read_text()
        assert said.count("SIGTERM received") == 1 and "checkpoint saved" in said and "To resume" in said
        assert not alive(stage) and not (project / "models/single-fp32").exists()
        assert {r.info.status for r in runs(project)} == {"KILLED"}
    finally:
        held.end()


def test_a_shell_prompt_is_no_reason_to_refuse_a_stage():
    """`source .venv/bin/activate` exports PS1; bash drops it in the non-interactive shell DVC runs
    each stage in: the server (started from the user's shell) and every stage would differ."""
    from ampbench.warm import context

    server = context.current({**os.environ, "PS1": "(.venv) $ ", "PROMPT_COMMAND": "history -a"})
    stage = context.current({k: v for k, v in os.environ.items() if k not in ("PS1", "PROMPT_COMMAND")})
    assert context.differences(stage, server) == []
    stage["env"]["PYTHONHASHSEED"] = "7"  # a variable libraries read at import still counts
    assert any("PYTHONHASHSEED" in d for d in context.differences(stage, server))


def test_a_file_rewritten_with_the_same_bytes_is_no_edit(tmp_path, monkeypatch):
    """`dvc exp run` stashes and re-applies uncommitted edits: files get new modification times
    and the same bytes. Only a changed byte is an edit that makes stages run plain."""
    from ampbench.warm import context

    package = tmp_path / "pkg"
    package.mkdir()
    module = package / "m.py"
    module.write_text("X = 1\n")
    monkeypatch.setattr(context, "PACKAGE", package)
    before = context.code_stamp()
    os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 10**9))
    assert context.code_stamp() == before
    module.write_text("X = 2\n")
    assert context.code_stamp() != before


def test_a_train_stages_system_metrics_sampler_runs_in_a_fork_too(command, tmp_path):
    """The 2026-12-07 H100 study took 429 s, not 335: the tracker sets
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT in the stage, so the server refused every train stage's
    system-metrics sampler (a process of its own, on by default on a GPU), which then imported
    torch and MLflow anew while the stage waited for it: about 10 s a stage."""
    project = new_project(tmp_path / "p", tracking={"system_metrics": "always"})
    since = len(command.log())
    proc = subprocess.run(
        [PY, "-m", "ampbench", *TRAIN], cwd=project, env=command.env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = command.log()[since:]
    assert re.search(r"pid \d+ runs `ampbench system-metrics ", log), log
    assert "refused" not in log and "running here" not in proc.stderr, log
    assert "system_metrics_monitor" not in proc.stderr  # MLflow's start and stop lines: noise


def test_mlflow_request_limits_set_by_a_stage_are_no_reason_to_refuse_its_helpers():
    from ampbench.warm import context

    server = context.current()
    stage = context.current(
        {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    )
    assert context.differences(stage, server) == []


def test_a_server_killed_outright_stops_its_stage_as_sigterm_does(tmp_path):
    """Hostile pass K: kill -9 of the warm server mid-stage SIGKILLed the stage: its seed and
    variant runs stayed RUNNING, and the client's one line said neither what was kept nor what to
    run. Now the stage gets a SIGTERM: it saves, ends its runs KILLED, and the client says so."""
    from conftest import runs

    held = Command()
    try:
        project, proc, stage = _training(held, tmp_path)
        os.kill(held.server, signal.SIGKILL)
        assert proc.wait(120) == 128 + signal.SIGTERM
        said = (project / "train.log").read_text()
        assert "checkpoint saved" in said and "To resume" in said, said[-3000:]
        assert f"the warm server ended while process {stage} ran this stage, which was stopped" in said
        assert not alive(stage)
        assert {r.info.status for r in runs(project)} == {"KILLED"}
    finally:
        held.end()
