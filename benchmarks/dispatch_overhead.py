"""What choosing a backend costs a CPU-side call (``linattn.ops.backends``), the decision alone.

    PYTHONPATH=src python benchmarks/dispatch_overhead.py [--calls 200000] [--json OUT]

Every public op asks ``backends.wanted(q)`` on every call: under "auto" it reads the backend
(a ContextVar), q's device and dtype, and says no for a CPU tensor. That is the overhead every
CPU call pays. The rows:

- ``wanted, auto, CPU float32``: that decision, as every CPU call makes it;
- ``wanted, torch``: the same inside ``backend("torch")``;
- ``choose, fla (routes cached)``: the whole decision where a call does go to fla (here with
  fla's import stood in for: nothing is run), the route lookup and the renaming of the
  arguments, paid only by calls sent to fla's kernels;
- ``empty loop``: the timing loop alone, subtracted from nothing (for reading the others).

Each row is the median over ``--repeats`` runs of ``--calls`` calls, per call, one thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from linattn import dispatch, registry
from linattn.ops import backend, backends


def per_call_ns(fn, calls: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args()
    torch.set_num_threads(1)

    entry = registry.get("gated_delta")
    x = entry.case.inputs(1, 64, 2, 16, 16, 0, torch.float32)
    q, g = x["q"], x["g"]
    given = {
        "q": q, "k": x["k"], "v": x["v"], "beta": x["beta"], "g": g, "scale": None,
        "mode": "chunk", "chunk_size": 64, "initial_state": x["S0"], "output_final_state": True,
        "cu_seqlens": None, "use_qk_l2norm": False,
    }  # fmt: skip
    rows = {}
    rows["empty loop"] = per_call_ns(lambda: None, args.calls, args.repeats)
    rows["wanted, auto, CPU float32"] = per_call_ns(
        lambda: backends.wanted(q), args.calls, args.repeats
    )
    with backend("torch"):
        rows["wanted, torch"] = per_call_ns(lambda: backends.wanted(q), args.calls, args.repeats)
    # fla's import and functions stood in for: the decision is timed, no kernel is run.
    dispatch.fla_ready = lambda: True
    dispatch.fla_function = lambda name: name
    with backend("fla"):
        assert backends.choose("delta_rule", q, g, given)[0] == "chunk_gated_delta_rule"
        rows["choose, fla (routes cached)"] = per_call_ns(
            lambda: backends.choose("delta_rule", q, g, given), args.calls // 10, args.repeats
        )
    header = f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread"
    print(header)
    for name, ns in rows.items():
        print(f"{name:32s} {ns / 1000:8.3f} us per call")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"setup": header, "calls": args.calls, "us": {
                k: round(v / 1000, 4) for k, v in rows.items()
            }}, out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
