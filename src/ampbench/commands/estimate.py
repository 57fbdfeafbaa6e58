"""`ampbench estimate`: time a few steps of the real model here, and say how long the study takes.

    ampbench estimate            # on a CUDA machine it only says so, unless --force

The work is training/progress.py's ``preflight`` (the same estimate `make run` prints first).
"""

from __future__ import annotations

import argparse

from ampbench.config import Config


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("--force", action="store_true", help="estimate on the CPU even when CUDA is present")


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench.training import progress

    progress.preflight(cfg, args.params, force=args.force)
    return 0
