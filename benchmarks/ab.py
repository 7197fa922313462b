"""A/B timing of two source trees of linattn, interleaved in one run (the "within 5%" checks).

    python benchmarks/ab.py OLD_SRC NEW_SRC [--rounds 5] [--T 16384] [--threads 1]

Each round runs one child process per tree, in alternating order, with ``PYTHONPATH`` set to
that tree's ``src`` folder and its own ``TORCH_EXTENSIONS_DIR`` (each tree builds its own fused
loop). A child times the chunk form's forward and forward + backward of every mechanism (float32,
B = 1, H = 8, K = V = 64; the bench's inputs: unit keys, beta = sigmoid(normal),
g = logsigmoid(normal + 4)), the median of ``--repeats`` runs by this process's CPU time, and
prints them as JSON. The report is, per row, the median and the minimum over every timed run of
each tree (the minimum: the run least disturbed by other jobs) and the ratios new / old:
interleaving makes a slow minute of this shared machine fall on both trees alike.

    python benchmarks/ab.py OLD_SRC NEW_SRC --ops [--T 16384]

times nothing: each tree's child runs every row once more after its warm-up and counts what it
does, which does not depend on the machine's load: the minor page faults of the call (fresh
memory touched: a new 32 MiB tensor is 8,192 of them) and, in a second call under
``torch.profiler``, its aten ops with their input shapes. The report gives both per row and
every op whose count differs (an extra copy, zero fill or allocation on the new path).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MECHANISMS = {
    # name: (op, gate) with gate None, "scalar" ([B, T, H]) or "channel" ([B, T, H, K])
    "linear": ("linear", None),
    "scalar_decay": ("linear", "scalar"),
    "gla": ("linear", "channel"),
    "delta": ("delta", None),
    "gated_delta": ("delta", "scalar"),
    "kda": ("delta", "channel"),
}


def child(args: argparse.Namespace) -> None:
    """Time every mechanism in this process (the tree on PYTHONPATH) and print JSON."""
    import torch
    import torch.nn.functional as F

    from linattn.ops import delta_rule, linear_attention

    torch.set_num_threads(args.threads)
    B, T, H, K = 1, args.T, 8, 64
    gen = torch.Generator().manual_seed(0)
    results = {}
    for name, (op, gate) in MECHANISMS.items():
        q = torch.randn(B, T, H, K, generator=gen)
        k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
        v = torch.randn(B, T, H, K, generator=gen)
        beta = torch.sigmoid(torch.randn(B, T, H, generator=gen)) if op == "delta" else None
        shape = None if gate is None else (B, T, H) if gate == "scalar" else (B, T, H, K)
        g = None if shape is None else F.logsigmoid(torch.randn(*shape, generator=gen) + 4.0)
        leaves = [x for x in (q, k, v, beta, g) if x is not None]

        def run(backward: bool, op=op, q=q, k=k, v=v, beta=beta, g=g, leaves=leaves) -> None:
            xs = [x.detach().requires_grad_(backward) for x in leaves]
            with torch.set_grad_enabled(backward):
                if op == "linear":
                    o = linear_attention(xs[0], xs[1], xs[2], *xs[3:], mode="chunk")[0]
                else:
                    o = delta_rule(*xs, mode="chunk")[0]
                if backward:
                    o.sum().backward()

        for backward in (False, True):
            run(backward)  # warm-up (and the first-use build)
            if args.ops:
                results[f"{name} {'fwd+bwd' if backward else 'fwd'}"] = counts(run, backward)
                continue
            times = []
            for _ in range(args.repeats):
                t0 = time.process_time()
                run(backward)
                times.append(time.process_time() - t0)
            results[f"{name} {'fwd+bwd' if backward else 'fwd'}"] = times
    print(json.dumps(results))


def counts(run, backward: bool) -> dict:
    """The minor page faults of one call of ``run(backward)`` and the aten ops of another."""
    import resource

    import torch

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    run(backward)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    with torch.profiler.profile(record_shapes=True) as prof:
        run(backward)
    ops = collections.Counter(
        f"{e.name} {e.input_shapes}" for e in prof.events() if e.name.startswith("aten::")
    )
    return {"faults": faults, "ops": dict(ops)}


def report_ops(runs: dict[str, list[dict]]) -> None:
    """Per row: page faults and aten ops of each tree, then every op whose count differs."""
    print("| row | old faults | new faults | old ops | new ops |")
    print("|---|---:|---:|---:|---:|")
    old, new = runs["old"][0], runs["new"][0]
    changed = []
    for row in old:
        o, n = old[row], new[row]
        print(
            f"| {row} | {o['faults']} | {n['faults']} | {sum(o['ops'].values())} "
            f"| {sum(n['ops'].values())} |"
        )
        for op in sorted(set(o["ops"]) | set(n["ops"])):
            a, b = o["ops"].get(op, 0), n["ops"].get(op, 0)
            if a != b:
                changed.append(f"{row}: {a} -> {b} {op}")
    print("\nops whose count differs (old -> new):" if changed else "\nthe same ops in every row")
    print("\n".join(changed))


def parent(args: argparse.Namespace) -> None:
    """Alternate children of the two trees for ``--rounds`` rounds and print the comparison."""
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(1 if args.ops else args.rounds):
        for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = dict(os.environ, PYTHONPATH=str(trees[label]))
            tag = hashlib.sha1(str(trees[label]).encode()).hexdigest()[:10]  # one build per tree
            env["TORCH_EXTENSIONS_DIR"] = f"/tmp/linattn-ab-ext-{label}-{tag}"
            cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the {label} tree's child failed:\n{done.stderr}")
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {label} done", file=sys.stderr)
    if args.ops:
        print(f"T = {args.T}, {args.threads} thread(s): one call of each row per tree")
        report_ops(runs)
        return
    print(f"T = {args.T}, {args.threads} thread(s), {args.rounds} rounds x {args.repeats} repeats")
    print("| row | old ms | new ms | new / old | old min | new min | min / min |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in runs["old"][0]:
        old, new = ([t * 1e3 for x in runs[label] for t in x[row]] for label in ("old", "new"))
        o, n = statistics.median(old), statistics.median(new)
        print(
            f"| {row} | {o:.1f} | {n:.1f} | {n / o:.3f} | {min(old):.1f} | {min(new):.1f} "
            f"| {min(new) / min(old):.3f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the old tree's src folder")
    parser.add_argument("new", help="the new tree's src folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ops", action="store_true", help="count page faults and ops, no timing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
