#!/usr/bin/env bash
# Who holds the interpreter while a train stage trains: the stage sampled by py-spy (`pip install
# py-spy`), only the samples of threads holding the GIL, 200 per second, per thread and per
# module. A timed epoch should show the main thread alone (the step, the loader, the scheduler);
# any other thread holding the GIL then takes it from the step (CPython hands it over every 5 ms).
#   scripts/profile_stage.sh single autocast [OUT_DIR]     # after `ampbench download`
set -euo pipefail
parallel=${1:-single}; precision=${2:-autocast}; out=${3:-reports/profile}
mkdir -p "$out"
raw="$out/$parallel-$precision.gil.txt"
py-spy record --gil --threads --rate 200 --format raw -o "$raw" -- \
    python3 -m ampbench train --parallel "$parallel" --precision "$precision" --fresh
python3 - "$raw" <<'PY'
import collections, re, sys
threads, mods = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    thread = re.sub(r"\s*\(?0x[0-9a-f]+\)?", "", frames[0]).strip() or "?"
    threads[thread] += int(n)
    top = next((f for f in reversed(frames[1:]) if "(" in f), "")
    mods[(thread, re.sub(r".*\((.*?):\d+\).*", r"\1", top))] += int(n)
total = sum(threads.values()) or 1
print("GIL-holding samples by thread:")
for t, n in threads.most_common():
    print(f"  {n / total:6.1%}  {t}")
print("top files by thread:")
for (t, m), n in mods.most_common(15):
    print(f"  {n / total:6.1%}  {t}: {m}")
PY
