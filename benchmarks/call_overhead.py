"""The Python around the kernels: a public op at T = 64 and one decoding step, per mechanism.

    PYTHONPATH=src python benchmarks/call_overhead.py [--calls 400] [--json OUT]

At T = 64 (B 1, H 2, K = V = 16, float32, no gradient) the fused kernels take microseconds, so a
call's time is mostly what the library does around them: checks, the mechanism's resolution,
layout. Likewise ``recurrent_step`` at B 1, H 2, K = V = 16. Each row is the median of ``--calls``
calls after a warm-up, on one thread. To compare two trees, run this file under each
(``PYTHONPATH=<tree>/src``) in alternation: ``benchmarks/call_overhead_ab.sh`` does, and prints
the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from linattn import ops


def inputs(T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    B, H, K = 1, 2, 16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    x = {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, K),
    }
    x["beta"] = torch.rand(B, T, H, generator=gen)
    x["g_head"] = -torch.rand(B, T, H, generator=gen)
    x["g_channel"] = -torch.rand(B, T, H, K, generator=gen)
    x["a"] = -x["beta"][..., None] * x["k"]
    x["b"] = x["k"]
    return x


def calls() -> dict[str, object]:
    """name -> a function of no arguments that runs one call."""
    x, s = inputs(64), inputs(1)
    q, k, v = x["q"], x["k"], x["v"]
    step = {n: t[:, 0] for n, t in s.items()}
    state = torch.zeros(1, 2, 16, 16)
    return {
        "linear_attention T64": lambda: ops.linear_attention(q, k, v),
        "linear_attention gla T64": lambda: ops.linear_attention(q, k, v, x["g_channel"]),
        "delta_rule T64": lambda: ops.delta_rule(q, k, v, x["beta"]),
        "delta_rule gated T64": lambda: ops.delta_rule(q, k, v, x["beta"], x["g_head"]),
        "delta_rule kda T64": lambda: ops.delta_rule(q, k, v, x["beta"], x["g_channel"]),
        "generalized_delta_rule T64": lambda: ops.generalized_delta_rule(
            q, k, v, x["a"], x["b"], x["g_channel"]
        ),
        "recurrent_step additive": lambda: ops.recurrent_step(
            state, step["q"], step["k"], step["v"]
        ),
        "recurrent_step delta": lambda: ops.recurrent_step(
            state, step["q"], step["k"], step["v"], step["beta"], step["g_head"]
        ),
        "recurrent_step dplr": lambda: ops.recurrent_step(
            state,
            step["q"],
            step["k"],
            step["v"],
            None,
            step["g_channel"],
            a=step["a"],
            b=step["b"],
        ),  # fmt: skip
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--json", help="write the medians (microseconds) to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    with torch.no_grad():
        for name, fn in calls().items():
            for _ in range(20):
                fn()
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            rows[name] = statistics.median(times) * 1e6
            print(f"{name:30s} {rows[name]:8.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
