"""What the pipeline command (``python -m ampbench.dvc_run``: `make run`, `make demo`, `make
tutorial`) checks and mends before DVC sees the project or its command line. A plain ``dvc repro``
or ``dvc exp run`` typed by hand does not pass through here.

1. DVC parses params.yaml before any stage runs, with a loader that expands YAML aliases (a few
   lines of nested ones: gigabytes, then a crash) and reports duplicate keys in a dozen lines. So
   the params file DVC will read (params.yaml here) is first read by the project's strict loader
   (``config.strict``: no torch, no DVC), and a fault in it is one line and exit 2, as
   ``ampbench train`` says it (``params_fault``).
2. A second pipeline command while one runs in the project (``make run`` twice) is refused,
   naming the one running: DVC's ``exp run -S`` would first rewrite params.yaml, under the running
   study, and only then find its outputs locked (``busy_fault``).
3. ``-S data.url=<path>`` (what ``make run DATA=<path>`` passes) is handed to DVC quoted for its
   override grammar (Hydra's), in which a quote, a comma or a bracket in a path would be a syntax
   error or a list of experiments: the path is a string, whatever it holds (``quoted_overrides``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

from ampbench import processes
from ampbench.config import ConfigError
from ampbench.config.strict import cut, read_params
from ampbench.data import archive_magic

PARAMS_FILE = "params.yaml"  # the params file DVC reads by default, beside dvc.yaml
EXIT_USAGE = 2  # as `ampbench` exits on a configuration error
RWLOCK = Path(".dvc", "tmp", "rwlock")  # DVC's record of the outputs each running stage writes
FREE_TEXT = ("data.url",)  # -S values that are strings whatever they hold (3. above)


def params_fault() -> str:
    """What is wrong with the params file DVC is about to parse, in one line ("" if nothing):
    read strictly, so an alias bomb is refused at its first anchor, before any value is built."""
    if not os.path.lexists(PARAMS_FILE):  # not a project folder: DVC says so itself
        return ""
    try:
        raw = read_params(Path(PARAMS_FILE))
    except ConfigError as err:
        return f"ERROR: {err}"
    return _axes_fault(raw)


def _axes_fault(raw: object) -> str:
    """The variant axes dvc.yaml's matrix reads (``${variants.parallel}``) that params.yaml lacks."""
    try:
        pipeline = Path("dvc.yaml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""  # DVC says what is wrong with its own file
    axes = raw.get("variants") if isinstance(raw, dict) else None
    missing = [
        a
        for a in ("parallel", "precision")
        if f"${{variants.{a}}}" in pipeline and (not isinstance(axes, dict) or a not in axes)
    ]
    if missing:  # DVC: "Could not find 'variants.parallel'", with no fix (hostile pass WARN)
        return (
            f"ERROR: {PARAMS_FILE} has no {', '.join(f'variants.{a}' for a in missing)}: dvc.yaml's "
            "matrix builds the study's variants from them; add them back (`git checkout params.yaml` "
            "restores the nine: variants: {parallel: [single, dp, ddp], precision: [fp32, autocast, "
            "autocast_gradscaler]})"
        )
    return ""


def busy_fault() -> str:
    """One line when DVC's rwlock names a live process writing this project's outputs (2. above)."""
    try:
        writers = json.loads(RWLOCK.read_text(encoding="utf-8")).get("write") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    for info in writers.values() if isinstance(writers, dict) else ():
        pid = info.get("pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and pid != os.getpid() and processes.alive(pid):
            cmd = cut(str(info.get("cmd", "dvc")))
            return (
                f"ERROR: this project is busy: pid {pid} ({cmd}) is running its pipeline; wait for "
                f"it to end, or stop it (Ctrl-C where it runs, or kill {pid}), then run this again"
            )
    return ""


def trainer_fault() -> str:
    """One line when a process outside any pipeline trains a variant here (`ampbench train`, `mlflow
    run`): DVC deletes a stage's outputs before its command runs, so its stage would have deleted
    that variant's published models/ before refusing the second trainer (hostile pass W: lost)."""
    from ampbench.paths import TRAIN_LOCK, WORK_DIR
    from ampbench.tracking.faults import lock_pids

    for lock in sorted(WORK_DIR.glob(f"*/{TRAIN_LOCK}")):
        if pids := lock_pids(lock):
            named = " ".join(map(str, pids))
            return (
                f"ERROR: {lock.parent.name} is being trained by pid {named}, outside this pipeline, whose "
                f"stage would first delete models/{lock.parent.name}/: wait for it or end it (kill "
                f"{named}), then run this again"
            )
    return ""


def quoted_overrides(argv: list[str]) -> list[str]:
    """argv with each ``-S <key>=<value>`` of a FREE_TEXT key quoted for DVC's override grammar:
    in single quotes, a quote escaped, and backslashes doubled where they come before a quote or
    the end (the grammar's only escapes); a value already quoted is left as it is."""
    out = list(argv)
    for i, arg in enumerate(out[1:], 1):
        key, eq, value = arg.partition("=")
        if out[i - 1] in ("-S", "--set-param") and eq and key in FREE_TEXT and value[:1] not in ("'", '"'):
            value = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, value).replace("'", "\\'")
            out[i] = f"{key}='{value}'"
    return out


def data_fault(data_url: str) -> str:
    """`make run DATA=<path>` naming no file or folder (or a URL of a scheme the download stage
    cannot fetch), in one line ("" if it names one, or an http(s) URL):
    DVC's ``exp run -S data.url=...`` would first write it into params.yaml, where a later plain
    `make run` would find it."""
    shown = data_url if len(data_url) <= 500 else cut(data_url)  # a path is worth reading whole
    fix = (
        "point DATA at the CIFAR-10 archive or its extracted folder (make run "
        "DATA=/path/to/cifar10.tar.gz), or leave DATA out to download it"
    )
    scheme = data_url.split("://", 1)[0].lower() if "://" in data_url else ""
    if scheme in ("http", "https") or not data_url:
        return ""  # the download stage says what is wrong with a URL, within its deadline
    if scheme not in ("", "file"):  # as the download stage refuses it (data/fetch.py)
        return f"DATA={shown}: {scheme}:// is not supported (http, https, file or a local path); {fix}"
    path = Path(data_url.removeprefix("file://")).expanduser()
    try:
        if not path.exists():
            return f"DATA={shown}: no such file or folder; {fix}"
        if not (path.is_file() or path.is_dir()):
            return f"DATA={shown}: is neither a file nor a folder (a device, FIFO or socket); {fix}"
        what = path.is_file() and _not_an_archive(path)
    except OSError as err:  # a name too long, a loop of links, a file it may not read
        return f"DATA={shown}: cannot be read ({err.strerror}); {fix}"
    return f"DATA={shown}: {what}; {fix}" if what else ""


def _not_an_archive(path: Path) -> str:
    """Why the file at DATA is no archive the download stage reads, from its first bytes ("" if it
    may be one): said before the estimate, not after it (hostile pass WARN: an HTML page given as
    DATA was refused by the download stage ~15 s in, naming data.url)."""
    with open(path, "rb") as f:
        head = f.read(512)
    if archive_magic.is_web_page(head):
        return "is a web page (HTML), not the archive: download the archive itself"
    if kind := archive_magic.other_archive(head):
        return f"is a {kind} archive; ampbench reads {archive_magic.READ}, so unpack it"
    if archive_magic.compression(head) or head[257:262] == b"ustar":  # the download stage checks the rest
        return ""
    return "is not a tar archive, nor a gzip, bzip2 or xz compressed one" if head else "is an empty file"


def main(data_url: str = "") -> int:
    """`python -m ampbench.dvc_guard [DATA]`: `make run`'s first step, before its estimate times
    steps (seconds), and dvc_run's before DVC: a params fault or a DATA naming nothing (exit 2),
    or a busy project (exit 1), in one line, at once; 0 when none."""
    faults = (
        (params_fault(), EXIT_USAGE),
        (data_fault(data_url), EXIT_USAGE),
        (busy_fault(), 1),
        (trainer_fault(), 1),
    )
    for fault, status in faults:
        if fault:
            print(fault, file=sys.stderr, flush=True)
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))


def filter_dvc_logs(quiet: logging.Filter) -> None:
    """``quiet`` filters each line DVC logs, in place of an earlier pipeline's in this process (CI:
    a stop noted by a test's pipeline stopped the next test's at its next stage)."""
    for name in ("dvc", "dvc_data", "dvc_objects"):
        for handler in logging.getLogger(name).handlers:
            for stale in [f for f in handler.filters if type(f) is type(quiet)]:
                handler.removeFilter(stale)
            handler.addFilter(quiet)


def note_ctrl_c_in_stages(noted, noted_after) -> None:
    """DVC ignores SIGINT while a stage's command runs (dvc.stage.run: the stage takes it); here
    ``noted`` takes it instead, so that a Ctrl-C the stage ended nothing with (it came as the
    stage's work was done: hostile pass J) stops DVC before its next stage. Where DVC puts its
    handler back, as the command has ended, ``noted_after`` takes SIGINT until DVC starts its next
    stage: DVC now writes the stage's outputs into dvc.lock, and a KeyboardInterrupt there lost
    the finished stage (hostile pass O: the re-run trained it again). An inherited ignore is kept."""
    import types

    from dvc.stage import run

    def noting(sig, handler):
        if sig != signal.SIGINT or handler is signal.SIG_IGN is signal.getsignal(sig):
            return signal.signal(sig, handler)
        return signal.signal(sig, noted if handler is signal.SIG_IGN else noted_after)

    run.signal = types.SimpleNamespace(**{**vars(signal), "signal": noting})  # type: ignore[attr-defined]
