"""The fused C++ kernel of the generalized delta rule on the CPU, as ratios of one run.

    S_t = Diag(exp g_t) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T,   o_t = S_t^T (scale q_t)

The issue's "Must show" at B = 1, T = 16,384, H = 8, K = V = 64, float32, the rule at its default
chunk size C = 32 (``linattn.ops.rules.dplr.CHUNK_SIZE``, its fastest here), the kernels
``torch.ops.linattn_native.chunk_forward`` / ``chunk_backward`` called directly (rule "dplr", the
inputs [a | b] in the beta slot), every speed a ratio measured in this process:

1. efficiency, one thread: the rule's operation count (below) over its time, over the rate of a
   2048 x 2048 float32 matrix product timed in the same process at the same thread count (the
   highest of the samples taken between the rows, as ``linattn bench``): forward >= 0.45, forward
   plus backward (counted 3 times the forward, as ``linattn bench``) >= 0.35;
2. two threads over one, forward and forward plus backward (8 heads: 4 a thread): >= 1.8;
3. the DPLR rule with a = -beta k, b = k, v' = beta v (the delta rule's row of the table) over the
   kernels' own delta rule, in turns: <= 1.6 (and the gated rows: b = exp(g) k, Gated DeltaNet and
   KDA, against theirs); the delta rule at its own default chunk size (``linattn.ops.delta_rule``,
   64) and at the DPLR rule's C as well (the delta rule is also faster at 32 here, so the second
   column is the comparison of each rule at its fastest).

The ratios of 2 and 3 are paired: each turn times the two calls a moment apart, and the median of
the turns' own ratios is reported with their lowest and highest (a slow minute on a shared machine
slows both calls of a turn and drops out of their ratio; before 2026-12-04 the ratio of the two
medians was reported).
4. fla's chunked PyTorch reference ``dplr_chunkwise`` (fla/ops/generalized_delta_rule/dplr/
   naive.py; its ``alpha`` reads, ours b; its ``beta`` writes, ours a; a per-channel gate) on the
   same inputs over ours, forward: >= 10 (fla at its chunk size 32 and at 64, the faster).

Operations, section 9's way of counting (the masked C x C products in full, a forward
substitution at C^2 per column), per chunk of C tokens with r = K, d = V:

    the products A_qk, A_qa (j <= i), A_bk, A_ba (j < i)      4 x 2 C^2 r    = 8 C^2 r
    A_bk V                                                     2 C^2 d
    the solve (I - A_ba) [W | U0] = [-Bd | A_bk V]             C^2 (r + d)
    U_b = U0 - W S                                             2 C r d
    o = Qd S + [A_qk | A_qa] [V; U_b]                          2 C r d + 4 C^2 d
    S <- D S + [Ke; Ae]^T [V; U_b]                             4 C r d
    total                                                      9 C^2 r + 7 C^2 d + 8 C r d

(the delta rule's, ``linattn.reference.costs.delta_chunk_ops``: 4 C^2 r + 3 C^2 d + 6 C r d).
The machine is shared: run it with ``--clock cpu`` (this process's CPU time) there, and read the
ratios, not the times.

    PYTHONPATH=src python benchmarks/dplr.py                 # the issue's shape (a few minutes)
    PYTHONPATH=src python benchmarks/dplr.py --clock cpu --T 4096 --no-fla
    PYTHONPATH=src python benchmarks/dplr.py --scaling-parts    # two threads, part by part
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from linattn.experiments import _timing
from linattn.experiments._timing import (
    matmul_call,
    matmul_rate,
    medians_in_turns,
    on_threads,
    paired_ratios,
    times_in_turns,
)
from linattn.ops import _native
from linattn.ops.delta_rule import delta_rule
from linattn.ops.rules import dplr
from linattn.reference.costs import delta_chunk_ops

GATES = ("none", "head", "channel")
DELTA_C = inspect.signature(delta_rule).parameters["chunk_size"].default  # the delta rule's own


def dplr_chunk_ops(C: int, r: int, d: int) -> int:
    """One chunk of the DPLR rule: 9 C^2 r + 7 C^2 d + 8 C r d (the module docstring)."""
    return 9 * C * C * r + 7 * C * C * d + 8 * C * r * d


def make_inputs(T: int, H: int, K: int, V: int, seed: int = 0) -> dict:
    """float32 [B = 1, T, H, D] inputs: unit keys, strengths beta in (0, 1), a read direction kk
    of unit length; the log-gates of trained models, per head and per channel."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(1, T, H, *shape, generator=gen)

    def unit(*shape):
        return torch.nn.functional.normalize(randn(*shape), dim=-1)

    x = {"q": randn(K), "k": unit(K), "v": randn(V), "kk": unit(K)}
    x["beta"] = torch.rand(1, T, H, generator=gen)
    x["g_head"] = torch.nn.functional.logsigmoid(randn(1) + 4.0)
    x["g_channel"] = torch.nn.functional.logsigmoid(randn(K) + 4.0)
    return x


def internal(t: torch.Tensor | None) -> torch.Tensor | None:
    """[B, T, H, D] as the kernels read it: a [B, H, T, D] view."""
    return None if t is None else t.transpose(1, 2)


def gate_of(x: dict, gate: str) -> torch.Tensor | None:
    return None if gate == "none" else x[f"g_{gate}"]


def dplr_args(x: dict, gate: str, delta_row: bool) -> tuple:
    """The dplr kernels' q, k, v, ab, g: the delta rule's row (a = -beta k, b = exp(g) k,
    v' = beta v) or a general transition (a = -beta kk, b = kk, another direction than k)."""
    beta = x["beta"][..., None]
    g = gate_of(x, gate)
    key = x["k"] if delta_row else x["kk"]
    decay = 1.0 if g is None or not delta_row else torch.exp(g)
    a, b = -beta * key, decay * key
    v = beta * x["v"] if delta_row else x["v"]
    ab = torch.cat([a, b], -1)
    return internal(x["q"]), internal(x["k"]), internal(v), internal(ab), internal(g)


def delta_args(x: dict, gate: str) -> tuple:
    beta = x["beta"].transpose(1, 2)
    return internal(x["q"]), internal(x["k"]), internal(x["v"]), beta, internal(gate_of(x, gate))


def calls(args: tuple, rule: str, gate: str, C: int) -> tuple[Callable, Callable]:
    """The forward call (no saved states) and the forward plus backward call of the kernels."""
    ops = torch.ops.linattn_native
    q, k, v, beta, g = args
    S0 = q.new_zeros(q.shape[0], v.shape[1], q.shape[-1], v.shape[-1])
    scale = q.shape[-1] ** -0.5
    d_o = torch.randn(v.shape[0], v.shape[2], v.shape[1], v.shape[3]).transpose(1, 2)
    dS = torch.randn(S0.shape)

    def forward():
        return ops.chunk_forward(q, k, v, beta, g, S0, scale, C, False, rule, gate)

    def forward_backward():
        _, _, states = ops.chunk_forward(q, k, v, beta, g, S0, scale, C, True, rule, gate)
        return ops.chunk_backward(q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate)

    return forward, forward_backward


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def efficiency(x: dict, args: argparse.Namespace, roofs: list[float]) -> list[dict]:
    """1. The general DPLR rule per gate at one thread: time, rate, efficiency (roof later)."""
    rows = []
    T, H, K, V, C = args.T, args.H, args.K, args.V, args.C
    ops = T // C * H * dplr_chunk_ops(C, K, V) + (T % C > 0) * H * dplr_chunk_ops(T % C, K, V)
    for gate in GATES:
        roofs.append(matmul_rate())
        forward, both = calls(dplr_args(x, gate, False), "dplr", gate, C)
        t_f, t_fb = medians_in_turns([forward, both], args.repeats)
        rows.append({"gate": gate, "ops": ops, "forward_s": t_f, "forward_backward_s": t_fb})
    return rows


def scaling(x: dict, args: argparse.Namespace) -> list[dict]:
    """2. Two threads over one, the general DPLR rule per gate, the counts in turns (wall-clock
    time whatever ``--clock``: CPU time adds the threads'): the median of the turns' own ratios
    (``paired_ratios``), with the lowest and highest; and the same for a 2048 x 2048 float32
    matrix product timed right after each gate's rows, what two threads give at that moment to
    work that scales (on a shared machine, less than 2 whenever the second core is busy)."""
    _timing.use_clock("wall")
    gemm = matmul_call()
    rows = []
    for gate in GATES:
        forward, both = calls(dplr_args(x, gate, False), "dplr", gate, args.C)
        row: dict = {"gate": gate}
        for name, fn in (("forward", forward), ("forward_backward", both), ("gemm", gemm)):
            one, two = times_in_turns(
                [on_threads(1, fn), on_threads(2, fn)],
                args.repeats,
            )
            ratios = paired_ratios(one, two)
            row[f"{name}_speedup"] = ratios["median"]
            row[f"{name}_speedup_range"] = [ratios["low"], ratios["high"]]
        set_threads(1)
        rows.append(row)
    _timing.use_clock(args.clock)
    return rows


def part_calls(args_: tuple, rule: str, gate: str, C: int) -> dict[str, Callable]:
    """The forward without and with the saved states, and the backward alone (on states saved
    once here)."""
    ops = torch.ops.linattn_native
    q, k, v, beta, g = args_
    forward, _ = calls(args_, rule, gate, C)
    S0 = q.new_zeros(q.shape[0], v.shape[1], q.shape[-1], v.shape[-1])
    scale = q.shape[-1] ** -0.5
    d_o = torch.randn(v.shape[0], v.shape[2], v.shape[1], v.shape[3]).transpose(1, 2)
    dS = torch.randn(S0.shape)
    _, _, states = ops.chunk_forward(q, k, v, beta, g, S0, scale, C, True, rule, gate)
    return {
        "forward": forward,
        "forward_keep": lambda: ops.chunk_forward(q, k, v, beta, g, S0, scale, C, True, rule, gate),
        "backward": lambda: ops.chunk_backward(
            q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate
        ),
    }


def scaling_parts(x: dict, args: argparse.Namespace) -> list[dict]:
    """Two threads over one for each part (``part_calls``) of the general DPLR rule and of the
    kernels' delta rule, per gate, in turns, wall clock: where the two-thread line is lost."""
    _timing.use_clock("wall")
    rows = []
    for rule in ("dplr", "delta"):
        for gate in GATES:
            made = dplr_args(x, gate, False) if rule == "dplr" else delta_args(x, gate)
            row = {"rule": rule, "gate": gate}
            for name, fn in part_calls(made, rule, gate, args.C).items():
                one, two = medians_in_turns(
                    [on_threads(1, fn), on_threads(2, fn)],
                    args.repeats,
                )
                row[name] = one / two
            set_threads(1)
            rows.append(row)
            print(" | ".join(f"{v:.2f}" if isinstance(v, float) else v for v in row.values()))
    _timing.use_clock(args.clock)
    return rows


def against_delta(x: dict, args: argparse.Namespace) -> list[dict]:
    """3. The DPLR rule on the delta rule's row over the kernels' delta rule, in turns: the
    median of the turns' own ratios (``paired_ratios``), with the lowest and highest."""
    rows = []
    for gate in GATES:
        dplr_f, dplr_fb = calls(dplr_args(x, gate, True), "dplr", gate, args.C)
        delta_f, delta_fb = calls(delta_args(x, gate), "delta", gate, DELTA_C)
        same_f, same_fb = calls(delta_args(x, gate), "delta", gate, args.C)
        t = times_in_turns([dplr_f, delta_f, same_f, dplr_fb, delta_fb, same_fb], args.repeats)
        row: dict = {"gate": gate}
        for name, i, j in (
            ("forward_ratio", 0, 1),
            ("forward_ratio_same_C", 0, 2),
            ("forward_backward_ratio", 3, 4),
            ("forward_backward_ratio_same_C", 3, 5),
        ):
            r = paired_ratios(t[i], t[j])
            row[name], row[f"{name}_range"] = r["median"], [r["low"], r["high"]]
        for name, i in (("delta", 1), ("delta_same_C", 2), ("dplr", 0)):
            row[f"{name}_forward_s"] = _timing.median(t[i])
            row[f"{name}_forward_backward_s"] = _timing.median(t[i + 3])
        rows.append(row)
    return rows


def against_fla(x: dict, args: argparse.Namespace) -> dict | None:
    """4. fla's ``dplr_chunkwise`` (per-channel gate) over ours, forward; None without fla."""
    try:
        from fla.ops.generalized_delta_rule.dplr.naive import dplr_chunkwise
    except Exception as error:  # fla-core needs triton to import
        print(f"fla unavailable ({type(error).__name__}: {error})", file=sys.stderr)
        return None
    q, k, v, ab, g = dplr_args(x, "channel", False)
    K = q.shape[-1]
    a, b = ab[..., :K], ab[..., K:]
    forward, _ = calls((q, k, v, ab, g), "dplr", "channel", args.C)
    result = {}
    for chunk in (32, 64):
        if args.T % chunk:
            continue
        # fla's layout [B, H, T, D] (contiguous, as its tests make them); alpha reads (b),
        # beta writes (a); it scales q by K^-0.5 itself, as ours is called.
        theirs = [t.contiguous() for t in (q, k, v, b, a, g.expand_as(q))]

        def fla_call(theirs=theirs, chunk=chunk):
            with torch.no_grad():
                return dplr_chunkwise(*theirs, chunk_size=chunk)

        ours, fla = medians_in_turns([forward, fla_call], max(1, args.fla_repeats))
        result[f"fla_C{chunk}_s"] = fla
        result[f"ours_C{args.C}_s"] = ours
    best = min(v for key, v in result.items() if key.startswith("fla"))
    result["speedup"] = best / result[f"ours_C{args.C}_s"]
    return result


def report(result: dict) -> str:
    """The ratios as a markdown summary."""
    lines = [
        f"DPLR kernels, {result['config']}; roof {result['roof'] / 1e9:.0f} GFLOP/s "
        f"(the highest of {len(result['roofs'])} samples at one thread)",
        "",
    ]
    lines.append(
        "| gate | forward ms | fwd+bwd ms | forward eff. (>= 0.45) | fwd+bwd eff. (>= 0.35) |"
    )
    lines.append("|---|---:|---:|---:|---:|")
    for r in result["efficiency"]:
        lines.append(
            f"| {r['gate']} | {1e3 * r['forward_s']:.1f} | "
            f"{1e3 * r['forward_backward_s']:.1f} | {r['forward_efficiency']:.2f} | "
            f"{r['forward_backward_efficiency']:.2f} |"
        )

    def paired(r: dict, key: str) -> str:
        """A paired ratio: the median of the turns' ratios, and their range where kept."""
        low_high = r.get(f"{key}_range")
        spread = f" ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else ""
        return f"{r[key]:.2f}{spread}"

    lines += [
        "",
        "Paired ratios: the median of the turns' own ratios (lowest-highest).",
        "",
        "| gate | 2 threads / 1, forward (>= 1.8) | fwd+bwd | a matrix product, just after |",
        "|---|---:|---:|---:|",
    ]
    for r in result["scaling"]:
        lines.append(
            f"| {r['gate']} | {paired(r, 'forward_speedup')} | "
            f"{paired(r, 'forward_backward_speedup')} | {paired(r, 'gemm_speedup')} |"
        )
    C, delta_C = result["C"], result["delta_C"]
    lines += [
        "",
        f"DPLR (the delta row, C {C}) over the delta rule at its default C {delta_C} and at C {C}:",
        "",
        f"| gate | forward, C {delta_C} (<= 1.6) | fwd+bwd, C {delta_C} | forward, C {C} | "
        f"fwd+bwd, C {C} |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["delta"]:
        lines.append(
            f"| {r['gate']} | {paired(r, 'forward_ratio')} | "
            f"{paired(r, 'forward_backward_ratio')} | {paired(r, 'forward_ratio_same_C')} | "
            f"{paired(r, 'forward_backward_ratio_same_C')} |"
        )
    fla = result.get("fla")
    if fla:
        times = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in fla.items() if k.endswith("_s"))
        lines += [
            "",
            f"fla dplr_chunkwise / ours, forward, per-channel gate (>= 10): "
            f"{fla['speedup']:.1f} ({times})",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--V", type=int, default=64)
    parser.add_argument("--C", type=int, default=dplr.CHUNK_SIZE, help="the dplr rule's chunk size")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--fla-repeats", type=int, default=2)
    parser.add_argument("--clock", choices=sorted(_timing.CLOCKS), default="wall")
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument(
        "--scaling-parts",
        action="store_true",
        help="only two threads over one for the forward, the forward keeping its states and the "
        "backward apart, the dplr and delta rules (rule | gate | the three ratios)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if not _native.available():
        print(f"the fused kernels are unavailable: {_native.reason()}", file=sys.stderr)
        return 1
    _timing.use_clock(args.clock)
    set_threads(1)
    x = make_inputs(args.T, args.H, args.K, args.V)
    if args.scaling_parts:
        parts = scaling_parts(x, args)
        if args.out:
            args.out.write_text(json.dumps(parts, indent=2))
        return 0
    roofs: list[float] = []
    rows = efficiency(x, args, roofs)
    roof = max(roofs)
    for r in rows:
        r["forward_efficiency"] = r["ops"] / r["forward_s"] / roof
        r["forward_backward_efficiency"] = 3 * r["ops"] / r["forward_backward_s"] / roof
    result = {
        "config": f"B 1, T {args.T}, H {args.H}, K {args.K}, V {args.V}, C {args.C}, "
        f"{args.clock} clock, medians of {args.repeats}",
        "C": args.C,
        "delta_C": DELTA_C,
        "roof": roof,
        "roofs": roofs,
        "delta_chunk_ops": delta_chunk_ops(args.C, args.K, args.V),
        "dplr_chunk_ops": dplr_chunk_ops(args.C, args.K, args.V),
        "efficiency": rows,
        "delta": against_delta(x, args),
        "scaling": scaling(x, args),
        "fla": None if args.no_fla else against_fla(x, args),
    }
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
