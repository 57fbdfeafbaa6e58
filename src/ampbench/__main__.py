"""`python -m ampbench` is the same as the `ampbench` command."""

from ampbench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
