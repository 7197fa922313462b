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
"""

from __future__ import annotations

import argparse
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
            times = []
            for _ in range(args.repeats):
                t0 = time.process_time()
                run(backward)
                times.append(time.process_time() - t0)
            results[f"{name} {'fwd+bwd' if backward else 'fwd'}"] = times
    print(json.dumps(results))


def parent(args: argparse.Namespace) -> None:
    """Alternate children of the two trees for ``--rounds`` rounds and print the comparison."""
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = dict(os.environ, PYTHONPATH=str(trees[label]))
            env["TORCH_EXTENSIONS_DIR"] = f"/tmp/linattn-ab-ext-{label}-{abs(hash(trees[label]))}"
            cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the {label} tree's child failed:\n{done.stderr}")
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {label} done", file=sys.stderr)
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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    child(args) if args.child else parent(args)


if __name__ == "__main__":
    main()
