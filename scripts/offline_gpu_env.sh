# Source this on an offline GPU machine that has Python, PyTorch and git but not this project's
# other packages (the lent GPU machine docs/BENCHMARKS.md measured on), from the repo root:
#
#   . scripts/offline_gpu_env.sh     # wheels carried in .whl/ (MLflow, DVC and what they need)
#
# It installs the wheels into /tmp/site, byte-compiles them (as pip does in a venv), and makes a
# `.venv` that the Makefile takes as installed: .venv/bin/python is the machine's python3 and
# `ampbench` / `dvc` are thin launchers, so `make run DATA=...`, `make tutorial DATA=...`,
# `make explain` and `make findings` then run exactly as the README documents. Without a git
# repository (a copied working tree) it makes one, as DVC's experiments need a commit.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
python3 -m compileall -q -j 0 /tmp/site src >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p .venv/bin
# a launcher, not a link: a linked python without pyvenv.cfg beside it loses its own venv
printf '#!/bin/sh\nexec "%s" "$@"\n' "$(command -v python3)" >.venv/bin/python
chmod +x .venv/bin/python
for tool in ampbench dvc; do
    printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$(command -v python3)" "$tool" >.venv/bin/$tool
    chmod +x .venv/bin/$tool
done
touch .venv/.installed
export PATH=$PWD/.venv/bin:$PATH
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    git init -q && git add -A && git -c user.name=ampbench -c user.email=ampbench@localhost commit -qm "working tree" || return 1
fi
git config user.name >/dev/null || git config user.name ampbench
git config user.email >/dev/null || git config user.email ampbench@localhost
