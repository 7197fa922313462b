"""Packed sequences (cu_seqlens) against the same tokens as a batch, ratios of one run.

The same T = 16,384 tokens (H 8, K = V = 64, float32, chunk 64, forward through the public ops) cut
into N sequences of T / N tokens, given either as a batch [N, T / N, H, D] or packed [1, T, H, D]
with cu_seqlens; the two are timed in turns in this process, and the ratio packed / batch is
printed per mechanism. "mixed" packs sequences of random lengths (uniform in [T/N/2, 3T/N/2])
against the same sequences run as a batch of the longest, padded (the cost of a dense batch).

    PYTHONPATH=src python benchmarks/packed.py               # one thread, three splits
    PYTHONPATH=src python benchmarks/packed.py --threads 2 --clock cpu
    PYTHONPATH=src python benchmarks/packed.py --backward    # training: forward and backward
"""

from __future__ import annotations

import argparse
import sys

import torch

from linattn.experiments import _timing
from linattn.experiments._timing import medians_in_turns
from linattn.ops import delta_rule, linear_attention

SPLITS = ((1024, 16), (256, 64), (64, 256))
MECHANISMS = ("linear", "gated_deltanet", "kda")


def call(mech: str, x: dict, cu: torch.Tensor | None, backward: bool = False) -> None:
    """One forward of ``mech`` on x (tensors [B, T, H, D]), and with ``backward`` the backward of
    the outputs' sum (x's tensors then require gradients)."""
    if mech == "linear":
        o = linear_attention(x["q"], x["k"], x["v"], cu_seqlens=cu)[0]
    else:
        g = x["g"] if mech == "gated_deltanet" else x["gk"]
        o = delta_rule(x["q"], x["k"], x["v"], x["beta"], g, cu_seqlens=cu)[0]
    if backward:
        for t in x.values():
            t.grad = None
        o.sum().backward()


def inputs(B: int, L: int, H: int, K: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    k = torch.nn.functional.normalize(rand(B, L, H, K), dim=-1)
    return {
        "q": rand(B, L, H, K),
        "k": k,
        "v": rand(B, L, H, K),
        "beta": torch.rand(B, L, H, generator=gen),
        "g": torch.nn.functional.logsigmoid(rand(B, L, H) + 3),
        "gk": torch.nn.functional.logsigmoid(rand(B, L, H, K) + 3),
    }


def packed(x: dict) -> dict:
    """[B, L, ...] -> [1, B L, ...] (a copy, as a packed batch would be stored)."""
    return {n: t.reshape(1, -1, *t.shape[2:]).clone() for n, t in x.items()}


def row(
    mech: str, N: int, L: int, H: int, K: int, repeats: int, mixed: bool, backward: bool = False
) -> dict:
    if not mixed:
        x = inputs(N, L, H, K)
        cu = torch.arange(0, N * L + 1, L)
        xp = packed(x)
    else:
        gen = torch.Generator().manual_seed(1)
        lengths = torch.randint(L // 2, 3 * L // 2 + 1, (N,), generator=gen)
        x = inputs(N, int(lengths.max()), H, K)  # the dense batch: padded to the longest
        xp = {n: torch.cat([t[i, : int(lengths[i])] for i in range(N)])[None] for n, t in x.items()}
        cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for t in (*x.values(), *xp.values()):
        t.requires_grad_(backward)
    batch, pack = medians_in_turns(
        [lambda: call(mech, x, None, backward), lambda: call(mech, xp, cu, backward)], repeats
    )
    return {"mechanism": mech, "split": f"{N} x {L}" + (" mixed" if mixed else ""),
            "batch_ms": 1e3 * batch, "packed_ms": 1e3 * pack, "ratio": pack / batch}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--K", type=int, default=64)
    p.add_argument("--backward", action="store_true", help="forward and backward (training)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    _timing.use_clock(args.clock)
    passes = "forward and backward" if args.backward else "forward"
    print(f"threads {args.threads}, clock {args.clock}, T 16384, H {args.H}, K = V = {args.K}, "
          f"{passes}")  # fmt: skip
    print(f"{'mechanism':<16}{'split':<16}{'batch ms':>10}{'packed ms':>11}{'packed/batch':>14}")
    for mech in MECHANISMS:
        for (N, L), mixed in [(s, False) for s in SPLITS] + [(SPLITS[1], True)]:
            r = row(mech, N, L, args.H, args.K, args.repeats, mixed, args.backward)
            print(f"{mech:<16}{r['split']:<16}{r['batch_ms']:>10.1f}{r['packed_ms']:>11.1f}"
                  f"{r['ratio']:>14.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
