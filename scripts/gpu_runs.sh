#!/usr/bin/env bash
# The GPU measurements behind docs/BENCHMARKS.md and docs/FINDINGS.md, one command each, for any
# machine with a GPU (an offline one: `. scripts/offline_gpu_env.sh` first). Each writes its
# results under reports/ (and MLflow) and prints a short summary.
#
#   scripts/gpu_runs.sh study    DATA   bench (same call) then the default study as `make run` runs it
#   scripts/gpu_runs.sh sampler  DATA   single-autocast with and without the system-metrics sampler
#   scripts/gpu_runs.sh explain  DATA   `make explain`
#   scripts/gpu_runs.sh tutorial DATA   the tutorial-conditions study, then `make findings`
set -uo pipefail
what=${1:?study, sampler, explain or tutorial}; data=${2:?the data source (archive, folder or URL)}
case $what in
study)
    [ -f data/prepared/cifar10.pt ] || ampbench download --set "data.url=$data"
    ampbench bench --compile none --out reports/bench
    start=$(date +%s)
    make run DATA="$data"
    echo "make run: $(( $(date +%s) - start )) s"
    python3 scripts/study_check.py --bench reports/bench.json --out reports/study_check.json ;;
sampler)
    [ -f data/prepared/cifar10.pt ] || ampbench download --set "data.url=$data"
    for metrics in auto never; do
        rm -rf models/single-autocast checkpoints/single-autocast
        ampbench train --parallel single --precision autocast --fresh \
            --set "data.url=$data" --set "tracking.system_metrics=$metrics"
        echo "tracking.system_metrics=$metrics:"
        python3 scripts/study_check.py | grep '^single-autocast '
    done ;;
explain)
    make explain DATA="$data" ;;
tutorial)
    make tutorial DATA="$data"
    python3 scripts/study_check.py --models tutorial/models
    make findings ;;
*)
    echo "unknown measurement $what: study, sampler, explain or tutorial" >&2; exit 2 ;;
esac
