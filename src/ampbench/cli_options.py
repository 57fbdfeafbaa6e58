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
