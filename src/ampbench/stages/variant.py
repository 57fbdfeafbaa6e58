"""`ampbench variant`, the MLproject entry point: everything one variant needs, in one command.

    ampbench variant --parallel dp --precision autocast --epochs 2 --seeds 0,1

Prepares the data if it is missing or was made from other data settings, then trains and
evaluates the variant, each as the `ampbench` command it is (same options, same overrides).
"""

from __future__ import annotations

from ampbench.config import Config
from ampbench.paths import DATA_FILE
from ampbench.stages.download import prepared_mismatch


def main(cfg: Config, args, argv: list[str]) -> int:
    from ampbench import cli

    base = ["--params", args.params, *sum((["--set", o] for o in cli.all_overrides(args)), [])]
    if not DATA_FILE.exists() or prepared_mismatch(cfg):
        code = cli.main(["download", *base])
        if code:
            return code
    v = ["--parallel", args.parallel, "--precision", args.precision]
    code = cli.main(["train", *v, *base]) or cli.main(["evaluate", *v, *base])
    if not code:
        from ampbench.tracking.tracker import Tracker

        print(f"Browse the runs: {Tracker.from_config(cfg).link()}")
    return code
