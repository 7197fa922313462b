#!/usr/bin/env bash
# Just-in-time builds from source trees without a binary, one kernel cache for all: two processes
# started at once (one compiles, the other waits, saying for whom), then two trees of different
# sources (B: a comment added to a header) alternating, which compile nothing after their first.
# Usage: PY=python-with-torch bash benchmarks/jit_builds.sh [SCRATCH]
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${1:-$(mktemp -d)}"
PY="${PY:-python}"
git clone -q "$repo" "$scratch/treeA"
git clone -q "$repo" "$scratch/treeB"
echo "// tree B: a comment changes the sources' hash" >> "$scratch/treeB/src/linattn/ops/csrc/kernels.h"
export TORCH_EXTENSIONS_DIR="$scratch/torch_extensions" OMP_NUM_THREADS=1
cat > "$scratch/call.py" <<'PY'
import sys
import time

t0 = time.perf_counter()
import torch

import linattn
from linattn.ops import _native, delta_rule

q, k, v = (torch.randn(1, 256, 4, 64) for _ in range(3))
k = torch.nn.functional.normalize(k, dim=-1)
beta = torch.rand(1, 256, 4)
t1 = time.perf_counter()
o, _ = delta_rule(q, k, v, beta, mode="chunk")
first = time.perf_counter() - t1
o64, _ = delta_rule(q.double(), k.double(), v.double(), beta.double(), mode="recurrent")
err = float((o.double() - o64).abs().max())
tree = linattn.__file__.split("/src/")[0]
print(f"{sys.argv[1]}: tree {tree}, first call {first:.2f} s (process "
      f"{time.perf_counter() - t0:.2f} s), fused {_native.ready()}, error {err:.1e}, "
      f"{_native.reason()}")
PY
echo "== two processes at once, tree A, empty cache"
s=$SECONDS
PYTHONPATH="$scratch/treeA/src" "$PY" "$scratch/call.py" P1 > "$scratch/p1.out" 2> "$scratch/p1.err" &
p1=$!
PYTHONPATH="$scratch/treeA/src" "$PY" "$scratch/call.py" P2 > "$scratch/p2.out" 2> "$scratch/p2.err" &
p2=$!
wait $p1; echo "P1 exit $?"; wait $p2; echo "P2 exit $?"
echo "both done in $((SECONDS-s)) s"
for p in p1 p2; do echo "-- $p stdout"; cat "$scratch/$p.out"; echo "-- $p stderr"; cat "$scratch/$p.err"; done
echo "== tree B (other sources), first run"
PYTHONPATH="$scratch/treeB/src" "$PY" "$scratch/call.py" B1 2>&1
echo "== alternating"
for i in 1 2; do
  PYTHONPATH="$scratch/treeA/src" "$PY" "$scratch/call.py" "A$i" 2>&1
  PYTHONPATH="$scratch/treeB/src" "$PY" "$scratch/call.py" "B$i" 2>&1
done
ls "$TORCH_EXTENSIONS_DIR"
