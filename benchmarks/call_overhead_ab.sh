#!/usr/bin/env bash
# The Python overhead of two trees, in alternation: call_overhead.py under OLD_TREE/src and under
# this tree's src, ROUNDS times each (old, new, old, new, ...), then per row the median over rounds
# of each and their ratio new / old.
#   bash benchmarks/call_overhead_ab.sh OLD_TREE [ROUNDS]
set -euo pipefail
old="$(cd "$1" && pwd)"; new="$(cd "$(dirname "$0")/.." && pwd)"; rounds="${2:-3}"
out="$(mktemp -d)"
for i in $(seq "$rounds"); do
  for side in old new; do
    tree="$old"; [ "$side" = new ] && tree="$new"
    # the script of this tree, so both sides time the same calls
    PYTHONPATH="$tree/src" python "$new/benchmarks/call_overhead.py" --json "$out/$side-$i.json" >/dev/null
  done
done
python - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {s: [json.load(open(f"{out}/{s}-{i}.json")) for i in range(1, rounds + 1)] for s in ("old", "new")}
print(f"{'call':30s} {'old us':>8s} {'new us':>8s} {'new/old':>8s}")
for name in runs["old"][0]:
    o = statistics.median(r[name] for r in runs["old"])
    n = statistics.median(r[name] for r in runs["new"])
    print(f"{name:30s} {o:8.1f} {n:8.1f} {n / o:8.3f}")
PY
