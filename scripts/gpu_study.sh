#!/usr/bin/env bash
# Run the study's stages in dvc.yaml's order, one process per stage as `dvc repro` does, with a
# wall-clock time per stage. For machines without DVC (the GPU machine used for
# docs/BENCHMARKS.md). Usage:
#   scripts/gpu_study.sh PARALLELS [compare] [-- extra ampbench args]
#   scripts/gpu_study.sh "single dp ddp" compare
#   PRECISIONS="fp32 autocast autocast_gradscaler autocast_bf16" scripts/gpu_study.sh single compare
set -uo pipefail
parallels=${1:-"single dp ddp"}; shift || true
precisions=${PRECISIONS:-"fp32 autocast autocast_gradscaler"}
do_compare=""; [[ "${1:-}" == compare ]] && { do_compare=1; shift; }
[[ "${1:-}" == -- ]] && shift
A="python3 -m ampbench"
stamp() { date +%s%N; }
study0=$(stamp)
variants=()
for stage in train; do  # dvc.yaml: every train@ stage, then the one evaluate stage
  for par in $parallels; do
    for prec in $precisions; do
      t0=$(stamp)
      $A "$stage" --parallel "$par" --precision "$prec" "$@" || echo "FAILED: $stage@$par-$prec"
      echo "STAGE $stage@$par-$prec $(( ($(stamp) - t0) / 1000000 )) ms"
      [[ $stage == train ]] && variants+=("$par-$prec")
    done
  done
done
list=$(IFS=,; echo "${variants[*]}")
t0=$(stamp); $A evaluate --variants "$list" "$@" || echo "FAILED: evaluate"
echo "STAGE evaluate $(( ($(stamp) - t0) / 1000000 )) ms"
if [[ -n $do_compare ]]; then
  t0=$(stamp); $A compare --variants "$list" "$@"; echo "STAGE compare $(( ($(stamp) - t0) / 1000000 )) ms"
fi
echo "STUDY $parallels / $precisions $(( ($(stamp) - study0) / 1000000 )) ms"
