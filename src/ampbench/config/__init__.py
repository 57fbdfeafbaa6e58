"""The study's configuration: ``settings`` (every setting of params.yaml, documented beside its
field), ``load`` (read, override, type-check) and ``rules`` (ranges and bounds). No torch here:
`ampbench --help` and a configuration error answer at once.

    cfg = load_config("params.yaml", overrides=["train.epochs=1"])
"""

from ampbench.config.load import load_config
from ampbench.config.settings import *  # noqa: F403 - the settings' names, as before the split
from ampbench.config.settings import __all__ as _settings

__all__ = [*_settings, "load_config"]
