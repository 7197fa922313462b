"""Forgetting attention (FoX), stick-breaking attention and PaTH attention in their blockwise
forms, against torch's SDPA (causal softmax attention), on the CPU with one thread.

    python benchmarks/softmax_blockwise.py [--T 4096 16384] [--H 4] [--D 64] [--block 256]
        [--repeats 3] [--threads 1] [--backward] [--ops sdpa fox_chunk ...]

For each T: the median wall time of ``--repeats`` calls (after one warm-up) of

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``;
- ``fox_chunk``: ``linattn.ops.softmax_variants.forgetting_attention(mode="chunk")`` with
  log forget gates logsigmoid(N(4, 1));
- ``stickbreaking_chunk``: ``stickbreaking_attention(mode="chunk")``;
- ``path_chunk``: ``linattn.ops.path.path_attention(mode="chunk")`` (PaTH, fla's layer's
  defaults: no forget gate), w unit vectors, beta = 2 sigmoid(N(0, 1)) in (0, 2);

float32, B = 1, H heads of D channels; with ``--backward`` the forward and backward of a sum.
The masked-product ("parallel") forms are not timed: at T = 16384 their T x T scores are 1 GiB
a head. Prints one JSON line per (T, op); the lead runs it and commits the output under
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from linattn.ops.path import path_attention
from linattn.ops.softmax_variants import forgetting_attention, stickbreaking_attention


def _inputs(T: int, H: int, D: int, backward: bool):
    gen = torch.Generator().manual_seed(0)
    x = {n: torch.randn(1, T, H, D, generator=gen) for n in ("q", "k", "v")}
    x["g"] = F.logsigmoid(torch.randn(1, T, H, generator=gen) + 4.0)
    x["w"] = F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1)
    x["beta"] = 2 * torch.sigmoid(torch.randn(1, T, H, generator=gen))
    return {n: t.requires_grad_(backward) for n, t in x.items()}


def _ops(block: int):
    def sdpa(x):
        q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fox(x):
        return forgetting_attention(x["q"], x["k"], x["v"], x["g"], mode="chunk", chunk_size=block)

    def stickbreaking(x):
        return stickbreaking_attention(x["q"], x["k"], x["v"], mode="chunk", chunk_size=block)[0]

    def path(x):
        q, k, v, w = (x[n] for n in ("q", "k", "v", "w"))
        return path_attention(q, k, v, w, x["beta"], mode="chunk", chunk_size=block)

    return {"sdpa": sdpa, "fox_chunk": fox, "stickbreaking_chunk": stickbreaking,
            "path_chunk": path}  # fmt: skip


def time_op(op, x, repeats: int, backward: bool) -> list[float]:
    times = []
    for i in range(repeats + 1):  # the first call warms up
        start = time.perf_counter()
        o = op(x)
        if backward:
            o.sum().backward()
        if i:
            times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--D", type=int, default=64)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--ops", nargs="+", choices=list(_ops(1)), help="default: all")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for T in args.T:
        x = _inputs(T, args.H, args.D, args.backward)
        for name, op in _ops(args.block).items():
            if args.ops and name not in args.ops:
                continue
            times = time_op(op, x, args.repeats, args.backward)
            row = {"T": T, "op": name, "H": args.H, "D": args.D, "block": args.block,
                   "threads": args.threads, "backward": args.backward,
                   "median_s": statistics.median(times), "times_s": times}  # fmt: skip
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
