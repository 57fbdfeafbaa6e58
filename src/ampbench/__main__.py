"""`python -m ampbench` is the same as the `ampbench` command."""

from ampbench.warm import main  # the cli, through a warm-start server when there is one

if __name__ == "__main__":
    raise SystemExit(main())
