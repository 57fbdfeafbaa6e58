"""`python -m ampbench` is the same as the `ampbench` command."""

from ampbench.entry import run

if __name__ == "__main__":
    raise SystemExit(run())
