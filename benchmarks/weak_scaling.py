"""Weak scaling: the same work per thread on one thread and on two, paired, kernels and a GEMM.

    python benchmarks/weak_scaling.py [--T 16384] [--turns 11]

Two threads over one (issue 34's ``>= 1.85x``) is the product of two things: how evenly the work
splits (the fused schedule gives each thread whole heads: 4 of B 1 H 8 each) and how fast a core
runs while the other works too. This measures the second alone: each turn times the fused C++
forward (``chunk_forward``, called directly) on 4 heads at one thread, then on 8 heads at two
threads (the same 4 heads' work per thread, the same strides), and likewise a matrix product of
2048 x 2048 x 1024 at one thread against 2048 x 2048 x 2048 at two. The ratio of each turn's two
times is 1.0 where a second busy core costs the first nothing; its median (and range) over the
turns is printed per mechanism. One thread at B 1 H 8 over two then goes at most 2 / that ratio.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from ab_kernels import ROWS, inputs

from linattn.experiments._timing import on_threads, paired_ratios, times_in_turns
from linattn.ops import native


def forward(x: dict[str, torch.Tensor], name: str) -> Callable[[], object]:
    """The fused forward of mechanism ``name`` on x's heads (x in the kernels' layout)."""
    rule, beta, g, gate = ROWS[name]
    H, K = x["q"].shape[1], x["q"].shape[-1]
    S0 = torch.zeros(1, H, K, K)
    beta_x, g_x = x.get(beta), x.get(g)
    op = torch.ops.linattn_native.chunk_forward
    return lambda: op(x["q"], x["k"], x["v"], beta_x, g_x, S0, K**-0.5, 64, False, rule, gate)


def weak(one: Callable[[], object], two: Callable[[], object], turns: int) -> dict[str, float]:
    """``one`` at 1 thread and ``two`` at 2, in turns: times and the per-turn ratios two / one."""
    fns = [on_threads(1, one), on_threads(2, two)]
    times_in_turns(fns, 1)  # warm up
    times = times_in_turns(fns, turns)
    one_ms, two_ms = (1e3 * statistics.median(t) for t in times)
    return {"one_ms": one_ms, "two_ms": two_ms} | paired_ratios(times[1], times[0])


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--turns", type=int, default=11)
    args = parser.parse_args(argv)
    if not native.available():
        raise SystemExit(f"the fused kernels are not available: {native.reason()}")
    x8 = inputs(args.T)  # [1, 8, T, ...] views of [1, T, 8, ...]
    x4 = {name: t[:, :4] for name, t in x8.items()}  # 4 of the heads, the same strides
    a = torch.randn(2048, 2048)
    b1, b2 = torch.randn(2048, 1024), torch.randn(2048, 2048)
    rows = {"matrix product": weak(lambda: a @ b1, lambda: a @ b2, args.turns)}
    for name in ROWS:
        rows[name] = weak(forward(x4, name), forward(x8, name), args.turns)
    print(f"T = {args.T}, {args.turns} turns: 4 heads on 1 thread, then 8 heads on 2 threads")
    print("| work | 1 thread ms | 2 threads ms (twice the work) | ratio, median (low-high) |")
    print("|---|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['one_ms']:.1f} | {r['two_ms']:.1f} | "
            f"{r['median']:.3f} ({r['low']:.2f}-{r['high']:.2f}) |"
        )
    return rows


if __name__ == "__main__":
    main()
