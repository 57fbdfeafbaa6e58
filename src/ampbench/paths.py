"""Where the stages read and write, relative to the project root (dvc.yaml names the same paths)."""

from __future__ import annotations

from pathlib import Path

DATA_FILE = Path("data/prepared/cifar10.pt")
SOURCE_FILE = DATA_FILE.with_name("source.json")  # the data settings DATA_FILE was made from
RAW_DIR = Path("data/raw")
MODELS_DIR = Path("models")
WORK_DIR = Path("checkpoints")  # in-progress seeds: checkpoints, finished models (no DVC output)
REPORTS_DIR = Path("reports")
