"""The exception a requested stop raises (SIGTERM, Ctrl-C, SIGHUP: stages/stop.py), in a module of
its own so that any code the stop may cross, the model factory's guards of the user's code
included, can let it through without importing the training loop.

A BaseException, as KeyboardInterrupt is: raised by a signal handler before the first step, it may
land inside any ``except Exception`` (a data set or checkpoint being read), which would report the
stop as a damaged file and give that fault's fix ("delete it and re-download")."""

from __future__ import annotations


class Stopped(BaseException):
    """Training stopped on request: after saving a checkpoint, or before there was anything to save."""
