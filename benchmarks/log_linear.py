"""Log-linear Mamba-2's chunk form over Mamba-2's, on the CPU.

    log-linear: O = (scale Q K^T (.) M^S (.) M^H) V, chunks of C: the masked product inside, a
                Fenwick tree of Mamba-2's chunk states across (O(T log T))
    Mamba-2:    S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t)  (O(T))

``linattn.ops.log_linear_attention`` against ``linattn.ops.linear_attention`` with the same
per-head gate, both ``mode="chunk"`` at the same C, forward only (no_grad), float32, B = 1, one
thread, at T = 4K, 16K, 64K (``--T``). Each pair is timed in turns (log-linear, Mamba-2, ...) and
the medians are reported: the ratio per T, and the growth exponent of each time in T (the slope
of log time against log T, between neighbouring T and over all of them). The log-linear weights
are L = bit_length(max T) + 1 levels, every level a token can read. ``--base gated_deltanet``
times log-linear Gated DeltaNet against ``linattn.ops.delta_rule`` (the same gate, beta) instead.

    PYTHONPATH=src python benchmarks/log_linear.py                       # H = 8, K = V = 64
    PYTHONPATH=src python benchmarks/log_linear.py --H 4 --K 128 --V 128 --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from linattn.ops import delta_rule, linear_attention, log_linear_attention


def make_inputs(T: int, H: int, K: int, V: int, L: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """float32 [1, T, H, D]: unit keys, log-decays logsigmoid(N(4, 1)) per head, weights
    lambda ~ U(0, 1) [1, T, H, L]."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(1, T, H, K), "k": torch.nn.functional.normalize(randn(1, T, H, K), dim=-1),
        "v": randn(1, T, H, V), "g": torch.nn.functional.logsigmoid(randn(1, T, H) + 4.0),
        "level_scales": torch.rand(1, T, H, L, generator=gen),
        "beta": torch.rand(1, T, H, generator=gen),
    }  # fmt: skip


def time_pair(
    x: dict[str, torch.Tensor], C: int, repeats: int, base: str = "mamba2"
) -> tuple[float, float]:
    """Median seconds of (log-linear, its base) forwards, timed in turns."""
    delta = base == "gated_deltanet"
    calls = [
        lambda: log_linear_attention(x["q"], x["k"], x["v"], x["g"], x["level_scales"],
                                     chunk_size=C, beta=x["beta"] if delta else None),
        (lambda: delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], chunk_size=C)) if delta
        else (lambda: linear_attention(x["q"], x["k"], x["v"], x["g"], chunk_size=C)),
    ]  # fmt: skip
    times: list[list[float]] = [[], []]
    with torch.no_grad():
        for call in calls:  # warm-up
            call()
        for _ in range(repeats):
            for i, call in enumerate(calls):
                start = time.perf_counter()
                call()
                times[i].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def slope(Ts: list[int], seconds: list[float]) -> float:
    """The least-squares slope of log(seconds) against log(T)."""
    xs, ys = [math.log(T) for T in Ts], [math.log(s) for s in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--V", type=int, default=64)
    parser.add_argument("--C", type=int, default=64, help="chunk size of both (a power of two)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", choices=("mamba2", "gated_deltanet"), default="mamba2",
                        help="the base mechanism (its memory under the levels)")  # fmt: skip
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("H", "K", "V", "C", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if any(T < 1 for T in args.T):
        parser.error("--T must be >= 1")
    if args.C & (args.C - 1):
        parser.error("--C must be a power of two")
    torch.set_num_threads(args.threads)
    Ts = sorted(args.T)
    L = Ts[-1].bit_length() + 1
    rows = []
    name = {"mamba2": "Mamba-2", "gated_deltanet": "Gated DeltaNet"}[args.base]
    print(f"log-linear {name} / {name}, chunk forms, float32, H = {args.H}, K = {args.K}, "
          f"V = {args.V}, C = {args.C}, L = {L}, {args.threads} thread(s), medians of "
          f"{args.repeats}")  # fmt: skip
    print(f"| T | log-linear (s) | {name} (s) | ratio | ratio / log2(T / C) |")
    print("|---|---|---|---|---|")
    for T in Ts:
        x = make_inputs(T, args.H, args.K, args.V, L)
        ours, base = time_pair(x, args.C, args.repeats, args.base)
        per_level = ours / base / max(math.log2(T / args.C), 1.0)
        rows.append({"T": T, "log_linear_s": ours, "mamba2_s": base, "ratio": ours / base})
        print(f"| {T} | {ours:.4f} | {base:.4f} | {ours / base:.2f} | {per_level:.2f} |")
    growth = {
        "log_linear": slope(Ts, [r["log_linear_s"] for r in rows]),
        "mamba2": slope(Ts, [r["mamba2_s"] for r in rows]),
        "ratio": slope(Ts, [r["ratio"] for r in rows]),
    }
    for a, b in zip(rows, rows[1:], strict=False):
        step = slope([a["T"], b["T"]], [a["log_linear_s"], b["log_linear_s"]])
        print(f"growth exponent of log-linear, T = {a['T']} -> {b['T']}: {step:.3f}")
    print(f"growth exponent over all T: log-linear {growth['log_linear']:.3f}, Mamba-2 "
          f"{growth['mamba2']:.3f}, ratio {growth['ratio']:.3f}")  # fmt: skip
    if args.out:
        result = {"base": args.base, "H": args.H, "K": args.K, "V": args.V, "C": args.C, "L": L,
                  "threads": args.threads, "repeats": args.repeats, "rows": rows,
                  "growth_exponent": growth}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
