"""Command line: `ampbench <stage>` (also `python -m ampbench`), one command per pipeline stage.

    ampbench download                       # fetch and prepare CIFAR-10 (data.url in params.yaml)
    ampbench train --parallel ddp --precision autocast
    ampbench evaluate --parallel ddp --precision autocast
    ampbench compare
    ampbench variant --precision autocast   # download if needed, train, evaluate (MLproject)
    ampbench bench --variants single-fp32,single-autocast
    ampbench estimate                       # how long the whole study takes on this CPU
    ampbench findings                       # docs/FINDINGS.md: the tutorial's claims, tested
    ampbench explain                        # why AMP pays or not here: the overhead ladder

Every stage reads params.yaml (``--params``) and ``--set section.key=value`` overrides, all
validated before anything runs. Each command's main is ``main(cfg, args, argv)`` in the module
``COMMANDS`` names, imported only when it runs: ``--help``, a usage error or a configuration
error is answered at once, without torch or MLflow.

An error the user can fix ends the command with one line and exit 1, no traceback: the errors in
``EXPECTED_ERRORS``, any fault of the MLflow store (server gone, database corrupt, locked or full:
``tracking.store.store_fault``) and a full disk. ``--debug`` (``-v``) or ``AMPBENCH_DEBUG=1``
(for commands that DVC or MLflow start) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ampbench import cli_options
from ampbench.config import ConfigError, load_config
from ampbench.variants import PARALLELS, PRECISIONS

log = logging.getLogger("ampbench")

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_STOPPED = 1, 2, 130, 143

# Each command's main, `module:function(cfg, args, argv) -> exit status`. dvc.yaml's deps of a
# stage are the code its command imports (tests/test_reliability.py checks them from this table).
COMMANDS = {
    "download": "ampbench.stages.download:main",
    "train": "ampbench.stages.train_main:main",
    "evaluate": "ampbench.stages.evaluate_main:main",
    "compare": "ampbench.stages.compare:main",
    "variant": "ampbench.stages.variant:main",
    "bench": "ampbench.stages.bench:main",
    "estimate": "ampbench.stages.estimate:main",
    "findings": "ampbench.stages.findings:main",
    "explain": "ampbench.stages.explain:main",
}

# Helper processes of a train stage, started as `ampbench <name> args...`: module:function(*args).
# Not stages: no parser entry, no --help.
HELPERS = {
    "system-metrics": "ampbench.tracking.train_runs:system_metrics_main",
}

# The commands that import torch: under `make run` they run in a fork of its warm server
# (ampbench.warm); the others answer at once without it.
WARM_COMMANDS = frozenset({"download", "train", "evaluate", "compare", *HELPERS})

# Errors that end a command with their message instead of a traceback (exit 1; --debug shows the
# traceback), by (top-level package, class name): matching them imports nothing, and a class
# that moves within the package still matches. tests/test_config.py checks that each exists.
EXPECTED_ERRORS = {
    ("ampbench", "DataError"),
    ("ampbench", "TrackingError"),
    ("ampbench", "ResumeError"),
    ("ampbench", "CheckpointError"),
    ("ampbench", "TrainingBusyError"),
    ("ampbench", "ParamsChangedError"),
    ("builtins", "FileNotFoundError"),
    ("builtins", "ValueError"),
}
STOPPED = ("ampbench", "Stopped")  # a stop signal ended training (checkpoint saved): exit 143


def _shared_options() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The options every command takes, and a variant's (--parallel, --precision)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--params", default="params.yaml", help="parameter file (default: %(default)s)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter, e.g. --set train.epochs=1 (repeatable)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        "--debug",
        dest="verbose",
        action="store_true",
        help="debug logging, and a traceback for every error (also: AMPBENCH_DEBUG=1)",
    )
    variant = argparse.ArgumentParser(add_help=False)
    variant.add_argument("--parallel", choices=PARALLELS, default="single", help="default: %(default)s")
    variant.add_argument("--precision", choices=PRECISIONS, default="fp32", help="default: %(default)s")
    return common, variant


def _parser() -> argparse.ArgumentParser:
    common, variant = _shared_options()
    p = argparse.ArgumentParser(
        prog="ampbench",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="<stage>")
    sub.add_parser("download", parents=[common], help="fetch and prepare the dataset")
    t = sub.add_parser("train", parents=[common, variant], help="train one variant, every seed")
    t.add_argument(
        "--fresh",
        action="store_true",
        help="discard a checkpoint written by another configuration and start over",
    )
    ev = sub.add_parser(
        "evaluate", parents=[common], help="evaluate the study's variants' models (or one variant's)"
    )
    ev.add_argument("--parallel", choices=PARALLELS, help="with --precision: one variant only")
    ev.add_argument("--precision", choices=PRECISIONS, help="with --parallel: one variant only")
    ev.add_argument(
        "--variants", default="", help="comma-separated variant names (default: params.yaml's `variants:`)"
    )
    c = sub.add_parser("compare", parents=[common], help="compare variants side by side")
    c.add_argument(
        "--variants", default="", help="comma-separated variant names (default: params.yaml's `variants:`)"
    )
    c.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare variants trained with different settings (refused otherwise), the table labelled so",
    )
    cli_options.add_variant(
        sub.add_parser("variant", parents=[common, variant], help="download if needed, train, evaluate")
    )
    cli_options.add_bench(
        sub.add_parser("bench", parents=[common], help="measure training throughput, untracked")
    )
    e = sub.add_parser(
        "estimate", parents=[common], help="time a few steps of the real model, estimate the whole study"
    )
    e.add_argument("--force", action="store_true", help="estimate on the CPU even when CUDA is present")
    cli_options.add_findings(
        sub.add_parser(
            "findings", parents=[common], help="docs/FINDINGS.md: the tutorial's claims against measured runs"
        )
    )
    cli_options.add_explain(
        sub.add_parser("explain", parents=[common], help="AMP's speed-up rung by rung and over batch sizes")
    )
    return p


def _function(target: str):
    """`module:function` imported: a command's main or a helper's."""
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HELPERS:
        return _function(HELPERS[argv[0]])(*argv[1:])
    args = _parser().parse_args(argv)
    _printable_output()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s"
        if "RANK" in os.environ
        else "%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = load_config(args.params, all_overrides(args))
        return _function(COMMANDS[args.command])(cfg, args, argv)
    except ConfigError as err:
        log.error("%s", err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        log.error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as err:
        kinds = {(c.__module__.partition(".")[0], c.__name__) for c in type(err).__mro__}
        if STOPPED in kinds:
            log.error("%s", err)
            return EXIT_STOPPED
        if debugging(args):
            raise
        if kinds & EXPECTED_ERRORS:
            log.error("%s", err)
            return EXIT_ERROR
        line = _fault_line(err)
        if line:
            log.error("%s", line)
            return EXIT_ERROR
        raise


def _printable_output() -> None:
    """Whatever the terminal's encoding (``PYTHONIOENCODING=ascii``, a C locale), printing a report
    (± and Δ in compare's table) never fails: a character stdout cannot encode prints as '?'."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.errors == "strict":
            stream.reconfigure(errors="replace")


def debugging(args) -> bool:
    """--debug / -v, or AMPBENCH_DEBUG set (not 0): show tracebacks instead of one-line errors."""
    return bool(args.verbose) or os.environ.get("AMPBENCH_DEBUG", "") not in ("", "0")


def _fault_line(err: BaseException) -> str | None:
    """One line for a full disk or a broken MLflow store anywhere in err's chain, else None."""
    from ampbench.tracking import faults, store  # import neither MLflow nor torch

    fault = faults.disk_full(err) or store.store_fault(err)
    return str(fault) if fault else None


def all_overrides(args) -> list[str]:
    """``--set`` overrides, then those of `ampbench variant`'s own options (--epochs, ...)."""
    out = list(args.overrides)
    for flag, key in (
        ("epochs", "train.epochs"),
        ("batch_size", "train.batch_size"),
        ("seeds", "train.seeds"),
        ("data_url", "data.url"),
        ("per_class", "data.train_per_class"),
        ("fc_dim", "model.fc_dim"),
        ("model", "model.name"),
    ):
        value = str(getattr(args, flag, "") or "").strip()
        if value:
            out.append(f"{key}=[{value}]" if flag == "seeds" else f"{key}={value}")
    return out


def run() -> int:
    """The ``ampbench`` command and ``python -m ampbench``: a stage runs in a fork of the command's
    warm server when there is one (``ampbench.warm``), else here, then ends quickly (``ending``).
    Tests call :func:`main`, which returns."""
    if sys.argv[1:2] and sys.argv[1] in WARM_COMMANDS:
        from ampbench.warm import client

        forwarded = client.forward(sys.argv[1:])
        if forwarded is not None:
            return forwarded
    code = main()
    if "torch" not in sys.modules:  # a light command: the normal exit is quick
        return code
    from ampbench.ending import finish

    os._exit(finish(code))
