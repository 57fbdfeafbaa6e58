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
validated before anything runs. Each command is a module that ``COMMANDS`` names, with its
``main(cfg, args, argv)`` and its options (``add_arguments``), imported only when it runs or shows
its ``--help``; its heavy imports wait inside main, so ``--help``, a usage error or a
configuration error is answered at once, without torch or MLflow.

An error the user can fix ends the command with one line and exit 1, no traceback: the errors in
``EXPECTED_ERRORS``, any fault of the MLflow store (server gone, database corrupt, locked or full:
``tracking.store.store_fault``), a full disk and a path this user may not write
(``tracking.faults.refused_write``). ``--debug`` (``-v``) or ``AMPBENCH_DEBUG=1``
(for commands that DVC or MLflow start) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from ampbench import address_space, cli_options, interrupts, output
from ampbench.chains import kinds
from ampbench.config import ConfigError, load_config
from ampbench.paths import dvc_recorded, unreadable_folder

# Imported now, not when a fault happens: a command that ran out of memory (a tight `ulimit -v`)
# can still say so in one line (hostile re-run: the fault path's own import failed, a second traceback).
from ampbench.tracking import faults, locations, store  # neither imports MLflow nor torch

log = logging.getLogger("ampbench")

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_STOPPED = 1, 2, 130, 143

# The command table: each command is a module of ampbench, named here with the line `ampbench --help`
# shows for it. The module holds `main(cfg, args, argv) -> exit status` and, if the command takes
# options of its own, `add_arguments(parser)`; it is imported only when its command runs (or shows
# its --help), so torch waits inside main, never at the module's top. dvc.yaml's deps of a stage are the
# code its command imports (tests/test_architecture.py checks them from this table).
COMMANDS = {
    "download": ("stages.download", "fetch and prepare the dataset"),
    "train": ("stages.train_main", "train one variant, every seed"),
    "evaluate": ("stages.evaluate_main", "evaluate the study's variants' models (or one variant's)"),
    "compare": ("stages.compare", "compare variants side by side"),
    "variant": ("commands.variant", "download if needed, train, evaluate"),
    "bench": ("commands.bench", "measure training throughput (MLflow: <experiment>-bench; not in DVC)"),
    "estimate": ("commands.estimate", "time a few steps of the real model, estimate the whole study"),
    "findings": ("commands.findings", "write docs/FINDINGS.md (en, zh): the tutorial's claims, tested"),
    "explain": ("commands.explain", "AMP's speed-up rung by rung and over batch sizes"),
}

# Helper processes of a train stage, started as `ampbench <name> args...`: module:function(*args).
# Not stages: no parser entry, no --help.
HELPERS = {
    "system-metrics": "ampbench.tracking.train_runs:system_metrics_main",
}

# The commands that import torch: under `make run` they run in a fork of its warm server
# (ampbench.warm); the others answer at once without it.
WARM_COMMANDS = frozenset({"download", "train", "evaluate", "compare", *HELPERS})
LIGHT_COMMANDS = frozenset({"findings"})  # import no torch: any `ulimit -v` will do
# Libraries a warm command loads before it starts, beside torch: one that does not fit in memory
# fails in the first seconds with one line, not after the work (hostile re-run: compare under
# `ulimit -v 3300000` failed at its late scipy import).
LIBRARIES = {"evaluate": ("sklearn.metrics", "scipy.stats"), "compare": ("scipy.stats",)}

# Errors that end a command with their message instead of a traceback (exit 1; --debug shows the
# traceback), by (top-level package, class name): matching them imports nothing, and a class
# that moves within the package still matches. tests/config/test_config.py checks that each exists.
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


def _parser(with_options=COMMANDS) -> argparse.ArgumentParser:
    """Every command, each with the options every command takes (cli_options.add_common); those in
    `with_options` also with their own (their module's `add_arguments`, imported for it)."""
    p = argparse.ArgumentParser(
        prog="ampbench",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="<stage>")
    for name, (_, summary) in COMMANDS.items():
        command = sub.add_parser(name, help=summary)
        cli_options.add_common(command)
        if name in with_options:  # the command that runs or shows its --help: what it does, in full
            command.description = getattr(command_module(name), "DESCRIPTION", None) or _sentence(summary)
            if hasattr(command_module(name), "add_arguments"):
                command_module(name).add_arguments(command)
    return p


def _sentence(summary: str) -> str:
    return summary[:1].upper() + summary[1:] + "."


def _parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; `ampbench --help` imports no command. An option the command does not take is
    refused with the command's usage, not the top-level one (hostile pass WARN)."""
    parser = _parser(argv[:1])
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def command_module(name: str):
    """The module of command `name` (COMMANDS), imported."""
    return importlib.import_module(f"ampbench.{COMMANDS[name][0]}")


def _function(target: str):
    """`module:function` imported: a command's main or a helper's."""
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in HELPERS:
        interrupts.command_started()
        return _function(HELPERS[argv[0]])(*argv[1:])
    args = _parse(argv)
    output.printable()
    output.charts_to_files()
    output.logging_to_stderr(args.verbose)
    cfg = None
    try:
        interrupts.command_started()  # from here a Ctrl-C is this command's stop line, or its stage's stop
        # before any stage or helper reads it; in here, a Ctrl-C while it loads SQLAlchemy is a stop
        # line, not a traceback (hostile pass V)
        locations.pin_tracking_uri()
        if fault := unreadable_folder():
            raise ConfigError(fault)
        cfg = load_config(args.params, all_overrides(args))
        if args.command not in LIGHT_COMMANDS and (short := address_space.below_floor()):
            log.error("%s", short)  # before torch: below it, torch's loading aborts in C++
            return EXIT_ERROR
        with interrupts.noted():
            if args.command in WARM_COMMANDS:  # torch's import runs Python from C++: a Ctrl-C waits
                with interrupts.held():
                    for library in ("torch", *LIBRARIES.get(args.command, ())):
                        importlib.import_module(library)
            code = command_module(args.command).main(cfg, args, argv)
            interrupts.check()  # a Ctrl-C swallowed on its way: the command did not do what it was asked
            if not code:  # done: a stop from here to the process's end stops nothing (hostile pass H)
                interrupts.completed(f"came as `ampbench {args.command}` ended: its work is done and kept")
        return code
    except ConfigError as err:
        log.error("%s%s", cli_options.as_given(str(err), args), _outputs_removed())
        return EXIT_USAGE
    except KeyboardInterrupt:  # outside a train stage's own stop handling (it saves, says how to resume)
        return _interrupted(args.command)
    except Exception as err:
        if interrupts.came:  # what a swallowed Ctrl-C broke (a half-made import): a stop, not a fault
            return _interrupted(args.command)
        if debugging(args):
            raise
        user_code = cfg and _user_code_line(err, cfg.model.name)  # a ValueError there: where it was
        if kinds(err) & EXPECTED_ERRORS and not user_code:
            log.error("%s", err)
            return EXIT_ERROR
        line = user_code or _fault_line(err)
        if line:
            log.error("%s", line)
            return EXIT_ERROR
        raise
    except BaseException as err:  # Stopped is one, as KeyboardInterrupt is: no `except Exception` takes it
        if STOPPED not in kinds(err):
            raise
        log.error("%s", err)
        return EXIT_STOPPED


def _outputs_removed() -> str:
    """Under DVC: its stage's outputs went as it started (hostile pass Z: a refused `-S` value left
    models/single-fp32 gone without a word); where they come back from."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return ""
    removed = "; DVC removed this stage's outputs as it started"
    if not dvc_recorded(stage):  # made outside DVC (hostile pass Y): nothing to check out
        return f"{removed} (dvc.lock records none): its next run makes them"
    return f"{removed}: `dvc checkout {stage}` puts them back"


def debugging(args) -> bool:
    """--debug / -v, or AMPBENCH_DEBUG set (not 0): show tracebacks instead of one-line errors."""
    return bool(args.verbose) or os.environ.get("AMPBENCH_DEBUG", "") not in ("", "0")


def _user_code_line(err: BaseException, model_name: str) -> str | None:
    """One line for a fault raised under the user's own model code (model.name's module, or its
    top package), naming its deepest line there (hostile re-run: a model whose forward fails only
    at the real batch size gave a 68-line traceback)."""
    import traceback

    top = sys.modules.get(model_name.partition(":")[0].split(".")[0]) if ":" in model_name else None
    where = getattr(top, "__file__", None)
    if not where or model_name.startswith("torchvision:"):
        return None
    mine = os.path.dirname(where) + os.sep if os.path.basename(where) == "__init__.py" else where
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename.startswith(mine):
            return (
                f"{type(err).__name__} in your code, {frame.filename}:{frame.lineno} ({frame.name}): "
                f"{' '.join(str(err).split())[:200]}; fix it there (model.name's module) and run the "
                "same command again; --debug shows the traceback"
            )
    return None


def _interrupted(command: str) -> int:
    # Under `make run` the pipeline's own command resumes it (final pass G: this line said "the same
    # command", then the pipeline's line another); the pipeline then adds no line of its own.
    again = os.environ.get("AMPBENCH_RESUME_COMMAND")
    if command == "variant":  # stopped outside its stages: `mlflow run`'s run (hostile pass K)
        again = again or command_module("variant").stopped_outside_its_stages()
    how = f"the stages that finished are kept. To resume: {again}" if again else "run the same command again"
    if not again and os.environ.get("DVC_STAGE"):  # hostile pass Y: a plain `dvc repro`, not this command
        how = (
            "run the pipeline command that started this stage again (`dvc repro`, `make run`, `dvc exp run`)"
        )
    if again and command == "estimate":  # make run's estimate, before any stage (hostile pass WARN)
        how = f"nothing ran yet. To run the study: {again}"
    sig = interrupts.signum or signal.SIGINT  # a SIGTERM or SIGHUP stops a command as Ctrl-C does
    said = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
    log.error("interrupted (%s): `ampbench %s` stopped before it finished; %s", said, command, how)
    interrupts.said()
    return 128 + sig


def _fault_line(err: BaseException) -> str | None:
    """One line for a library that memory could not hold, a full disk, a broken MLflow store or a
    path this user may not write (the last resort: the stages check what they can before any work)
    anywhere in err's chain, else None. Memory first: the others may import (hostile re-run:
    the store's check imported SQLAlchemy under a `ulimit -v` that could not hold it)."""
    if line := address_space.out_of_memory(err):
        return line
    try:
        fault = faults.disk_full(err) or store.store_fault(err) or faults.refused_write(err)
    except (MemoryError, ImportError, OSError) as own:  # making the line ran out of memory itself
        return address_space.OUT_OF_MEMORY if address_space.out_of_memory(own) else None
    return str(fault) if fault else None


def all_overrides(args) -> list[str]:
    """``--set`` overrides, with `ampbench variant`'s quick run and own options (--epochs, ...)."""
    return cli_options.variant_overrides(args)


def run() -> int:
    """The ``ampbench`` command and ``python -m ampbench``: a stage runs in a fork of the command's
    warm server when there is one (``ampbench.warm``), else here, then ends quickly (``process_exit``).
    Tests call :func:`main`, which returns."""
    output.charts_to_files()  # before the warm server compares environments: it has none either
    if sys.argv[1:2] and sys.argv[1] in WARM_COMMANDS:
        from ampbench.warm import client

        forwarded = client.forward(sys.argv[1:])
        if forwarded is not None:
            return forwarded
    interrupts.last = True
    code = main()
    # The work is over, stopped or not: a Ctrl-C pressed again has nothing left to stop, and would
    # only break the exit's own clean-up with tracebacks (hostile pass Y: atexit callbacks').
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not its command's own end
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "torch" not in sys.modules:  # a light command: the normal exit is quick
        return code
    from ampbench.process_exit import finish

    os._exit(finish(code))
