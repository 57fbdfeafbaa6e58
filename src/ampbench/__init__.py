"""ampbench: what mixed precision and data parallelism really buy, measured on your hardware.

Run `ampbench --help` for the stages, or `dvc repro` for the whole study.
"""

__version__ = "0.1.0"
