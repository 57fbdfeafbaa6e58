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
# py-spy's raw format: "frame;frame;... count"; with --threads one frame names the thread
# ("thread (0x...)"); the frames after it run from the thread's entry to the sampled line.
share, files = collections.Counter(), collections.Counter()
entry = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    at = next((i for i, f in enumerate(frames) if f.startswith("thread")), 0)
    tid, rest = frames[at], frames[at + 1 :]
    share[tid] += int(n)
    ours = [f for f in rest if "ampbench" in f or "threading.py" in f]
    entry[tid][ours[1] if len(ours) > 1 else (rest[0] if rest else "?")] += int(n)
    leaf = re.sub(r":\d+\)$", ")", rest[-1]) if rest else "?"
    files[(tid, leaf)] += int(n)
total = sum(share.values()) or 1
print(f"GIL-holding samples: {total}")
for tid, n in share.most_common():
    print(f"  {n / total:6.1%}  {tid}  (entered at {entry[tid].most_common(1)[0][0]})")
print("most sampled lines:")
for (tid, leaf), n in files.most_common(12):
    print(f"  {n / total:6.1%}  {tid}: {leaf}")
PY
