"""The options every command takes (``add_common``), a variant's (``add_variant_choice``), and
option types several commands share; each command adds its own (its module's ``add_arguments``).
No torch here."""

from __future__ import annotations

import argparse

from ampbench.variants import PARALLELS, PRECISIONS


def add_common(p: argparse.ArgumentParser) -> None:
    """--params, --set and --debug, which every command takes."""
    p.add_argument("--params", default="params.yaml", help="parameter file (default: %(default)s)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter, e.g. --set train.epochs=1 (repeatable)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        "--debug",
        dest="verbose",
        action="store_true",
        help="debug logging, and a traceback for every error (also: AMPBENCH_DEBUG=1)",
    )


def add_variant_choice(p: argparse.ArgumentParser) -> None:
    """--parallel and --precision: the one variant a command works on."""
    p.add_argument("--parallel", choices=PARALLELS, default="single", help="default: %(default)s")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="default: %(default)s")


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def at_least_zero(text: str) -> int:
    """A count that may be 0 (none, or: the default), never negative (final pass J: bench ran its
    whole measurement with --workers -3 and --max-images -1)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


# `ampbench variant --quick yes` (`mlflow run . -P quick=yes`): a run of a minute or two on a CPU
# that shows the whole path (data, training, evaluation, the answer in MLflow) and measures
# nothing worth quoting. Test accuracy only at the end, on a test subset: on a CPU, scoring all
# 10,000 test images after each epoch was 82% of such a run (docs/MLFLOW.md).
QUICK_RUN = (
    "data.train_per_class=100",
    "data.test_per_class=100",
    "train.batch_size=128",
    "model.fc_dim=256",
    "train.epochs=2",
    "train.seeds=[0]",
    "train.eval_each_epoch=false",
)
# `ampbench variant`'s own options: (flag, config key, help's example). `mlflow run` passes a
# parameter that MLproject does not declare as `--<name> <value>` (its own spelling: batch_size),
# so that the command it echoes holds only what was given; both spellings are accepted.
VARIANT_OPTIONS = (
    ("--epochs", "train.epochs", ""),
    ("--batch-size", "train.batch_size", " (global)"),
    ("--seeds", "train.seeds", ", e.g. 0,1"),
    ("--data-url", "data.url", ", e.g. a local archive"),
    ("--per-class", "data.train_per_class", ": a balanced subset for a quick run, e.g. 100"),
    ("--test-per-class", "data.test_per_class", ": test images per class scored, e.g. 100"),
    ("--fc-dim", "model.fc_dim", ", e.g. 256 for a quick run"),
    ("--model", "model.name", ", e.g. torchvision:resnet18 or mypkg.nets:make_model"),
)
YES, NO = ("yes", "true", "1"), ("no", "false", "0", "")


def variant_fix(*keys: str) -> str:
    """Under `mlflow run` / `ampbench variant` (its quick run overrides params.yaml), the parameters
    that set ``keys``, as a note for a fix naming them (hostile pass U); "" elsewhere."""
    import os

    if os.environ.get("AMPBENCH_SCOPE") != "variant":
        return ""
    flags = {key: flag for flag, key, _ in VARIANT_OPTIONS}
    named = [flags[key][2:].replace("-", "_") for key in keys if key in flags]
    return f" (`mlflow run`: {', '.join(f'-P {name}=' for name in named)})" if named else ""


def yes_no(text: str) -> bool:
    if text.strip().lower() in YES + NO:
        return text.strip().lower() in YES
    raise argparse.ArgumentTypeError(f"yes or no, got {text!r}")


def variant_overrides(args) -> list[str]:
    """The quick run's settings (--quick), then ``--set``'s, then `ampbench variant`'s own options'."""
    out = [*(QUICK_RUN if getattr(args, "quick", False) else ()), *args.overrides]
    return out + [item for item, _ in _option_overrides(args)]


def _option_overrides(args) -> list[tuple[str, str]]:
    """`ampbench variant`'s own options as overrides, each with how the user gave it: `--epochs 2`,
    or under `mlflow run` `-P epochs=2`."""
    import os

    out = []
    for flag, key, _ in VARIANT_OPTIONS:
        value = str(getattr(args, flag[2:].replace("-", "_"), "") or "").strip()
        if value:
            name = flag[2:].replace("-", "_")
            given = f"-P {name}={value}" if os.environ.get("MLFLOW_RUN_ID") else f"{flag} {value}"
            out.append((f"{key}=[{value}]" if flag == "--seeds" else f"{key}={value}", given))
    return out


def as_given(message: str, args) -> str:
    """A configuration error's "(from --set '<key>=<value>')" for a value an option of `ampbench
    variant` gave, in that option's words (hostile passes P, R: `-P epochs=zero` was "from --set")."""
    from ampbench.config.strict import cut, shown
    from ampbench.output import hide_credentials

    options = _option_overrides(args)
    for item, given in options:
        message = message.replace(f"(from --set {shown(hide_credentials(item))})", f"(from {cut(given)})")
    if options and not args.overrides:
        message = message.replace(" and --set overrides):", " and the options given):", 1)
    return message
