"""What a stage must share with the warm server to run in a fork of it (standard library only).

A forked child keeps what the server's imports read: environment variables (TORCH_LOGS,
TORCHINDUCTOR_*, PYTHONHASHSEED, LD_*, ...), the code on disk, the interpreter and its path. It also
gets the server's cgroup, resource limits, CPU affinity, priority and user. So the server runs a
stage only where all of these equal the stage's own; any difference and the stage runs plain.
"""

from __future__ import annotations

import hashlib
import os
import resource
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# Set per process by make, DVC and torchrun, or read by MLflow and ampbench when used, not at
# import: a difference in these is no reason to refuse. OMP_NUM_THREADS (torchrun sets 1 per
# worker) is applied again in the child (torch.set_num_threads).
RUN_TIME_PREFIXES = ("DVC_", "AMPBENCH_", "TORCHELASTIC_")
RUN_TIME_NAMES = frozenset(
    {
        *("PWD", "OLDPWD", "SHLVL", "_", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"),
        # a shell's prompts: `source .venv/bin/activate` exports PS1, and bash drops it in the
        # non-interactive shell DVC runs a stage in, so every stage would differ from the server
        *("PS1", "PS2", "PS4", "PROMPT_COMMAND"),
        *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"),
        *("ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"),
        *("TORCH_NCCL_ASYNC_ERROR_HANDLING",),
        # MLflow reads these when used (`mlflow run` sets the run's); its logging ones at import
        *("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"),
        # read when used; tracking.tracker sets them in a train stage, which then starts its
        # system-metrics sampler: refused, it imported torch and MLflow anew, ~10 s a GPU stage
        *("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"),
        *("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",),
    }
)
LIMITS = sorted(name for name in dir(resource) if name.startswith("RLIMIT_"))


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in RUN_TIME_NAMES and not k.startswith(RUN_TIME_PREFIXES)}


def code_stamp() -> list[str]:
    """The package's files as the server imported them: an edit makes stages run plain. By content,
    not modification time: `dvc exp run` stashes and re-applies uncommitted edits, rewriting files
    with the same bytes, which must not make every stage of the study run plain (~200 s of start-ups
    on a GPU study). Hashing the ~80 files takes about a millisecond."""
    return sorted(
        f"{f.relative_to(PACKAGE)}:{hashlib.blake2b(f.read_bytes(), digest_size=8).hexdigest()}"
        for f in PACKAGE.rglob("*.py")
    )


def current(env: dict[str, str] | None = None) -> dict:
    """This process's context, as JSON-ready lists (what the client sends, the server compares)."""
    return {
        "env": import_time_env(dict(os.environ if env is None else env)),
        "cgroup": Path("/proc/self/cgroup").read_text(),
        "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "user": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        # sys.path[0] is the script's folder or the working folder (`ampbench` vs `python -m`)
        "interpreter": [sys.executable, sys.path[1:], sys.flags.optimize, sys.warnoptions, sys._xoptions],
        "code": code_stamp(),
    }


def differences(stage: dict, server: dict) -> list[str]:
    """What differs, in words (empty: the stage may run in the server's fork)."""
    found = []
    for name in sorted(set(stage["env"]) | set(server["env"])):
        here, there = stage["env"].get(name), server["env"].get(name)
        if here != there:
            found.append(f"environment variable {name} ({_shown(here)} here, {_shown(there)} in the server)")
    for name in sorted(set(stage["limits"]) | set(server["limits"])):
        if stage["limits"].get(name) != server["limits"].get(name):
            found.append(
                f"resource limit {name} ({stage['limits'].get(name)} here, {server['limits'].get(name)})"
            )
    words = {
        "cgroup": "cgroup",
        "affinity": "CPU affinity",
        "nice": "nice value",
        "user": "user or groups",
        "interpreter": "Python interpreter, sys.path or flags (-O, -W, -X)",
        "code": "ampbench's code (edited since the server started)",
    }
    found += [text for key, text in words.items() if stage.get(key) != server.get(key)]
    return found


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value if len(value) < 40 else value[:37] + "...")
