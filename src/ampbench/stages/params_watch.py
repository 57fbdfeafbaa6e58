"""One stage, one configuration: a train stage's models are published only if params.yaml still
says what they were trained with.

An edit of params.yaml while a stage trains (the next experiment prepared in an editor, a
``git checkout``) would otherwise go unnoticed: DVC records the params it reads when the stage
*ends* in dvc.lock, beside models trained with the old ones. ``ParamsWatch`` reads the params
file (with the stage's ``--set`` overrides) again after each seed (a stage of one process; a DDP
stage's ranks go on together) and before the models are published, and compares
its config digest (``Config.digest``: every setting that changes what training computes) with
the one the stage started with; a difference fails the stage with one line naming the settings.
"""

from __future__ import annotations

import os

from ampbench.config import Config, ConfigError, load_config
from ampbench.config.strict import shown


class ParamsChangedError(RuntimeError):
    """params.yaml changed under a running stage; names the settings and what to do."""


class ParamsWatch:
    def __init__(self, cfg: Config, params_file: str, overrides: list[str]) -> None:
        self.cfg, self.params_file, self.overrides = cfg, params_file, list(overrides)

    def check(self) -> None:
        """Raise ParamsChangedError if the params file now gives another config digest."""
        try:
            now = load_config(self.params_file, self.overrides)
        except ConfigError as err:
            changed = f"it no longer loads: {str(err).splitlines()[-1].strip()}"
        else:
            if now.digest() == self.cfg.digest():
                return
            before, after = self.cfg.flat(), now.flat()
            changed = ", ".join(
                f"{key} {shown(before[key])} -> {shown(after[key])}"
                for key in before
                if before[key] != after[key] and not key.startswith(Config.NOT_DIGESTED)
            )
        again = os.environ.get("AMPBENCH_RESUME_COMMAND") or "the same command"
        raise ParamsChangedError(
            f"{self.params_file} changed while this stage ran ({changed}); its models were trained "
            "with the old settings and are not published. To publish them, put the old settings back "
            f"and re-run: the finished seeds are not trained again. To train with the new ones, run {again}"
        )
