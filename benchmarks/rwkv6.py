"""RWKV-6 over GLA on the CPU, as ratios of one run (within 1.15x).

    RWKV-6: o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t
    GLA:    o_t = S_t^T (scale q_t)          both with S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

``linattn.ops.rwkv6`` against ``linattn.ops.linear_attention`` with the same per-channel gate, at
B = 1, T = 16,384, H = 8, K = V = 64, C = 64, float32, one thread (the fused C++ chunk loop): the
forward, and the forward plus backward (the gradients of q, k, v, g and u from one weighted sum
of o), each pair timed in turns (RWKV-6, GLA, RWKV-6, ...) so that both medians come from the same
minutes. The machine may be shared: ``--clock cpu`` times this process's CPU time.

    PYTHONPATH=src python benchmarks/rwkv6.py                   # the issue's shape (a few minutes)
    PYTHONPATH=src python benchmarks/rwkv6.py --clock cpu --T 4096 --repeats 5
    PYTHONPATH=src python benchmarks/rwkv6.py --clock cpu --parts  # where RWKV-6's extra time goes
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable

import torch

from linattn.experiments import _timing
from linattn.experiments._args import kernel_timing_arguments
from linattn.experiments._timing import medians_in_turns
from linattn.ops import linear_attention, rwkv6


def make_inputs(T: int, H: int, K: int, V: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """float32 [1, T, H, D] inputs: unit keys, the log-decays of a trained model per channel
    (logsigmoid(N(4, 1)), decays near 0.98), a bonus u ~ N(0, 1) [H, K]."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(1, T, H, K), "k": torch.nn.functional.normalize(randn(1, T, H, K), dim=-1),
        "v": randn(1, T, H, V), "g": torch.nn.functional.logsigmoid(randn(1, T, H, K) + 4.0),
        "u": randn(H, K),
    }  # fmt: skip


def calls(x: dict[str, torch.Tensor], C: int, backward: bool) -> list[Callable[[], object]]:
    """(RWKV-6, GLA) as calls: forward under no_grad, or forward plus backward."""
    ops = [
        lambda: rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], chunk_size=C),
        lambda: linear_attention(x["q"], x["k"], x["v"], x["g"], chunk_size=C),
    ]
    if not backward:

        def forward(op):
            with torch.no_grad():
                return op()

        return [lambda op=op: forward(op) for op in ops]
    weight = torch.randn(x["v"].shape, generator=torch.Generator().manual_seed(1))

    def both(op):
        o, _ = op()
        (o * weight).sum().backward()
        for t in x.values():
            t.grad = None

    return [lambda op=op: both(op) for op in ops]


def parts(x: dict[str, torch.Tensor], repeats: int) -> dict[str, float]:
    """The pieces of RWKV-6's time beyond GLA's kernels, each timed in turns in this process (s):
    the forwards, the backward's two whole-sequence copies (q' and d_o': one in the extension's
    cached blocks, against the same copy into fresh memory), and the bonus's backward pass."""
    op = importlib.import_module("linattn.ops.rwkv6")
    bonus = importlib.import_module("linattn.ops._bonus")
    q, k, v, g, u = (x[n].detach() for n in "qkvgu")
    d_o = torch.randn(v.shape, generator=torch.Generator().manual_seed(2))
    dq, dk, dv = q.clone(), k.clone(), v.clone()
    first = torch.zeros_like(q[:, :1])

    def fresh_copy():
        out = torch.empty_like(q)
        out[:, :-1] = q[:, 1:]
        out[:, -1] = 0

    fns = {
        "GLA forward": lambda: linear_attention(q, k, v, g),
        "RWKV-6 forward": lambda: rwkv6(q, k, v, g, u),
        "q' copy, cached blocks": lambda: op._shifted(q),
        "q' copy, fresh memory": fresh_copy,
        "bonus backward pass": lambda: bonus.shifted_bonus_backward_(
            d_o, q, k, v, u, 0.125, dq, dk, dv, first
        ),
    }
    with torch.no_grad():
        for fn in fns.values():
            fn()
        times = medians_in_turns(list(fns.values()), repeats)
    for name, t in zip(fns, times, strict=True):
        print(f"{name:<24} {t * 1e3:8.1f} ms", flush=True)
    return dict(zip(fns, times, strict=True))


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    _timing.use_clock(args.clock)
    x = make_inputs(args.T, args.H, args.K, args.K)
    result: dict[str, object] = {"options": vars(args)}
    if args.parts:
        result["parts_s"] = parts(x, args.repeats)
        return result
    for name, backward in (("forward", False), ("forward+backward", True)):
        if backward:
            x = {n: t.requires_grad_() for n, t in x.items()}
        fns = calls(x, args.C, backward)
        for fn in fns:  # warm up: the kernels' first call builds or loads them
            fn()
        t_rwkv6, t_gla = medians_in_turns(fns, args.repeats)
        result[name] = {"rwkv6_s": t_rwkv6, "gla_s": t_gla, "ratio": t_rwkv6 / t_gla}
        print(f"{name:<17} RWKV-6 {t_rwkv6:.4f} s  GLA {t_gla:.4f} s  RWKV-6 / GLA "
              f"{t_rwkv6 / t_gla:.3f} (issue: <= 1.15)", flush=True)  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kernel_timing_arguments(parser, repeats=7)
    parser.add_argument("--parts", action="store_true", help="time the pieces instead")
    args = parser.parse_args(argv)
    result = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
