"""Warm starts scoped to one command: `make run`/`make demo`/`make tutorial` (``ampbench.dvc_run``)
start a server that imports torch, MLflow and scikit-learn once; the stages DVC starts under that
command run in processes forked from it instead of importing them again (~8 s a stage on the H200
host: docs/BENCHMARKS.md).

- ``scope``: the command's side. Starts the server as its own child (same session, cgroup, limits,
  affinity and priority: the server is part of the command, not a service), names its socket in
  ``AMPBENCH_WARM_SOCKET`` for the stages, and ends it with the command. A plain `dvc repro` or
  `ampbench train` has no such variable and runs plain processes.
- ``client``: the stage's side (``cli.run``), standard library only. It sends its arguments,
  working folder, environment, signal dispositions and stdin/stdout/stderr, then waits for the
  exit status and passes signals on.
- ``context``: what must be equal between a stage and the server for the stage to run there
  (the environment that libraries read at import, cgroup, resource limits, CPU affinity, nice,
  user and interpreter). Any difference and the stage runs as a plain process.
- ``server``: forks a child per stage, never while a second thread runs and never after CUDA is
  initialised.

No variable set, a refusal, or a server that is gone: the stage runs plain, as it always can. A
server that does not greet it in 5 s (stopped: ``kill -STOP``) too, after one line saying so.
"""

SOCKET_ENV = "AMPBENCH_WARM_SOCKET"
