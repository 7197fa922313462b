#!/usr/bin/env bash
# From a fresh clone: the README's first install command in a fresh venv with an empty kernel
# cache (the kernels compile here, once), then a first delta_rule call from another folder, timed.
# Usage: bash benchmarks/first_install.sh [SCRATCH]  (SCRATCH: an empty folder to work in)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${1:-$(mktemp -d)}"
git clone -q "$repo" "$scratch/clone"
cd "$scratch/clone"
python3 -m venv "$scratch/venv"
# shellcheck disable=SC1091
source "$scratch/venv/bin/activate"
export TORCH_EXTENSIONS_DIR="$scratch/torch_extensions"
s=$SECONDS; pip install -q "torch==2.13.0"; echo "torch install: $((SECONDS-s)) s"
s=$SECONDS
pip install "torch==2.13.0" "setuptools>=77" && pip install --no-build-isolation -e ".[plot]"
echo "README first command's install: $((SECONDS-s)) s"
cd "$scratch"
python - <<'PY'
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from linattn.ops import delta_rule, _native
t2 = time.perf_counter()
q, k, v = (torch.randn(1, 512, 8, 64) for _ in range(3))
k = torch.nn.functional.normalize(k, dim=-1)
beta = torch.rand(1, 512, 8)
t3 = time.perf_counter()
o, S = delta_rule(q, k, v, beta, mode="chunk", output_final_state=True)
t4 = time.perf_counter()
print(f"import torch {t1-t0:.2f} s, import linattn.ops {t2-t1:.2f} s, "
      f"first delta_rule call {t4-t3:.3f} s")
print("ready:", _native.ready(), "|", _native.reason())
PY
echo "entries in the kernel cache: $(ls -A "$TORCH_EXTENSIONS_DIR" 2>/dev/null | wc -l)"
