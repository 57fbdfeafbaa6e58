"""The study's pipeline stages (dvc.yaml): download, train (with its DDP launcher, lock, stop and
params watch), evaluate and compare; the commands that are not stages live in ``commands/``."""
