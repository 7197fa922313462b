"""bfloat16 and float16 inputs over float32 on the CPU, as ratios of one run.

The same inputs (B = 1, T = 16,384, H = 8, K = V = 64, chunk 64, one thread by default) given to
the public ops in float32 and in a lower precision, the forward (under no_grad) and the forward
plus backward (the gradients of every input from one weighted sum of o); the two dtypes are timed
in turns (float32, bfloat16, float32, ...) so that both medians come from the same minutes (each
timed call after an untimed one of its dtype, which refills the output cache), and
the ratio low / float32 is printed per mechanism. The arithmetic is float32 either way: the ratio
is the cost of reading and writing the lower precision (the issue: within 1.1x). The machine may
be shared: ``--clock cpu`` times this process's CPU time.

    PYTHONPATH=src python benchmarks/bf16.py --clock cpu               # a few minutes
    PYTHONPATH=src python benchmarks/bf16.py --dtype float16 --T 4096 --out f16.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch

from linattn.experiments import _timing
from linattn.experiments._args import kernel_timing_arguments
from linattn.ops import delta_rule, linear_attention

MECHANISMS = ("linear", "gla", "delta", "gated_deltanet", "kda")


def make_inputs(T: int, H: int, K: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """[1, T, H, D] inputs in ``dtype`` (the float32 values rounded once): unit keys, beta in
    [0, 1], log-decays near a trained model's (logsigmoid(N(3, 1)), per head and per channel)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {
        "q": randn(1, T, H, K), "k": torch.nn.functional.normalize(randn(1, T, H, K), dim=-1),
        "v": randn(1, T, H, K), "beta": torch.rand(1, T, H, generator=gen),
        "g": torch.nn.functional.logsigmoid(randn(1, T, H) + 3.0),
        "gk": torch.nn.functional.logsigmoid(randn(1, T, H, K) + 3.0),
    }  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


def op(mech: str, x: dict, C: int) -> Callable[[], tuple]:
    """One call of ``mech``'s public op on x, chunks of C tokens."""
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    return {
        "linear": lambda: linear_attention(q, k, v, chunk_size=C),
        "gla": lambda: linear_attention(q, k, v, x["gk"], chunk_size=C),
        "delta": lambda: delta_rule(q, k, v, beta, chunk_size=C),
        "gated_deltanet": lambda: delta_rule(q, k, v, beta, x["g"], chunk_size=C),
        "kda": lambda: delta_rule(q, k, v, beta, x["gk"], chunk_size=C),
    }[mech]


def call(mech: str, x: dict, C: int, backward: bool) -> Callable[[], object]:
    """The forward under no_grad, or the forward plus backward of one weighted sum of o."""
    f = op(mech, x, C)
    if not backward:

        def forward():
            with torch.no_grad():
                return f()

        return forward
    weight = torch.randn(x["v"].shape, generator=torch.Generator().manual_seed(1))
    weight = weight.to(x["v"].dtype)

    def both():
        o, _ = f()
        (o * weight).sum().backward()
        for t in x.values():
            t.grad = None

    return both


def medians_in_warm_turns(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median time of each of ``fns`` over ``repeats`` turns (f1, f2, f1, f2, ...), each timed
    call right after an untimed one of the same fn: the extension's block cache (csrc/
    block_cache.cpp) keeps freed outputs for the next of the same size, and two dtypes in turns
    have different sizes, so that without the untimed call every call would find none and fault
    in fresh pages (a training loop repeats one dtype's sizes)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times, strict=True):
            fn()
            start = _timing.clock()
            fn()
            spent.append(_timing.clock() - start)
    return [statistics.median(t) for t in times]


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    _timing.use_clock(args.clock)
    low = getattr(torch, args.dtype)
    result: dict[str, object] = {"options": {**vars(args), "out": str(args.out)}, "rows": []}
    print(f"threads {args.threads}, clock {args.clock}, B 1, T {args.T}, H {args.H}, "
          f"K = V = {args.K}, chunk {args.C}; {args.dtype} over float32")  # fmt: skip
    print(f"{'mechanism':<16}{'pass':<18}{'float32 ms':>11}{args.dtype + ' ms':>14}{'ratio':>8}")
    for backward in (False, True):
        xs = [make_inputs(args.T, args.H, args.K, dtype) for dtype in (torch.float32, low)]
        if backward:
            xs = [{n: t.requires_grad_() for n, t in x.items()} for x in xs]
        for mech in args.mechanisms:
            fns = [call(mech, x, args.C, backward) for x in xs]
            for fn in fns:  # warm up: the kernels' first call builds or loads them
                fn()
            t32, tlow = medians_in_warm_turns(fns, args.repeats)
            name = "forward+backward" if backward else "forward"
            row = {"mechanism": mech, "pass": name, "float32_s": t32, "low_s": tlow,
                   "ratio": tlow / t32}  # fmt: skip
            result["rows"].append(row)
            print(f"{mech:<16}{name:<18}{1e3 * t32:>11.1f}{1e3 * tlow:>14.1f}"
                  f"{tlow / t32:>8.3f}", flush=True)  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kernel_timing_arguments(parser, repeats=5)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    args = parser.parse_args(argv)
    result = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
