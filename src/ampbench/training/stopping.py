"""The exception a requested stop raises (SIGTERM, Ctrl-C, SIGHUP: stages/stop.py), in a module of
its own so that any code the stop may cross, the model factory's guards of the user's code
included, can let it through without importing the training loop."""

from __future__ import annotations


class Stopped(Exception):
    """Training stopped on request: after saving a checkpoint, or before there was anything to save."""
