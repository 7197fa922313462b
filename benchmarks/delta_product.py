"""Gated DeltaProduct's forward time over the delta rule's on the same T, one run.

    S <- alpha_t S;  S <- (I - beta_tj k_tj k_tj^T) S + beta_tj k_tj v_tj^T (j = 1 .. n_h);
    o_t = S^T (scale q_t)

The issue's "Must show" at B = 1, T = 16,384, H = 8, K = V = 64, chunk 64, float32, one thread,
a gate per head (Gated DeltaNet's and fla's layer's): ``gated_delta_product`` with n_h = 2 and 3
over ``delta_rule`` on T tokens, forward (no_grad), timed in turns in this process: <= 2.2 and
<= 3.3. The op runs the delta rule's fused C++ chunk loop on the T n_h write rows, reading q's
T rows in place (``reads`` = n_h: chunks of whole tokens, C rounded down to a multiple of n_h,
63 rows at n_h = 3) and forming the outputs (Qd S, A_qk U) of the rows read only; a second
column compares it with ``delta_rule`` called on the interleaved rows (q repeated on each write
row, every output formed, the unread ones dropped after: the op's way before), with the same
chunks. The last column is the share of the operation count (section 9's way,
``reference.costs.delta_chunk_ops``) spent on the outputs of the rows not read (n_h - 1 of every
n_h, with A_qk): what skipping them saves at most (the op still forms A_qk whole).

    PYTHONPATH=src python benchmarks/delta_product.py                  # the issue's shape
    PYTHONPATH=src python benchmarks/delta_product.py --clock cpu --T 4096 --repeats 5
    PYTHONPATH=src python benchmarks/delta_product.py --clock cpu --T 4096 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json

import torch

from linattn.experiments import _timing
from linattn.experiments._timing import medians_in_turns
from linattn.ops import delta_rule, gated_delta_product
from linattn.ops.delta_product import interleave_gate, interleave_query
from linattn.reference.costs import delta_chunk_ops


def make_inputs(
    T: int, H: int, K: int, V: int, n: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict:
    """[1, rows, H, D] inputs in ``dtype`` (float32 values rounded once): unit keys, beta in
    (0, 1), a gate per head near 0.98."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {
        "q": randn(1, T, H, K),
        "k": torch.nn.functional.normalize(randn(1, T * n, H, K), dim=-1),
        "v": randn(1, T * n, H, V),
        "beta": torch.rand(1, T * n, H, generator=gen),
        "g": torch.nn.functional.logsigmoid(randn(1, T, H) + 4.0),
    }
    return {name: t.to(dtype) for name, t in x.items()}


def dropped_output_share(n: int, C: int, K: int, V: int) -> float:
    """The outputs' share of the delta rule's chunk operations (Qd S: 2 C r d; A_qk: 2 C^2 r;
    A_qk U: 2 C^2 d) times the fraction of rows whose outputs are dropped, (n - 1) / n."""
    outputs = 2 * C * K * V + 2 * C * C * K + 2 * C * C * V
    return outputs / delta_chunk_ops(C, K, V) * (n - 1) / n


def measure(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(args.threads)
    _timing.use_clock(args.clock)
    T, H, K, V, C = args.T, args.H, args.K, args.V, args.C
    dtype = getattr(torch, args.dtype)
    base = make_inputs(T, H, K, V, 1, dtype=dtype)
    rows = []
    for n in args.n:
        x = make_inputs(T, H, K, V, n, seed=n, dtype=dtype)
        q_rows, g_rows = interleave_query(x["q"], n), interleave_gate(x["g"], n)

        def delta(x=base):
            return delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], chunk_size=C)

        def product(x=x, n=n):
            return gated_delta_product(
                x["q"], x["k"], x["v"], x["beta"], x["g"], num_householder=n, chunk_size=C
            )

        def on_rows(x=x, q=q_rows, g=g_rows, rows=C - C % n):  # the op's chunks of whole tokens
            return delta_rule(q, x["k"], x["v"], x["beta"], g, chunk_size=rows)

        with torch.no_grad():
            product()  # the first call builds or loads the C++ kernels
            t_delta, t_product, t_rows = medians_in_turns([delta, product, on_rows], args.repeats)
        rows.append(
            {
                "n_h": n,
                "delta_rule_s": t_delta,
                "delta_product_s": t_product,
                "ratio": t_product / t_delta,
                "target": {2: 2.2, 3: 3.3}.get(n),
                "over_delta_rule_on_rows": t_product / t_rows,
                "dropped_output_share": dropped_output_share(n, C, K, V),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--V", type=int, default=64)
    parser.add_argument("--C", type=int, default=64)
    parser.add_argument("--n", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    shape = f"T = {args.T}, H = {args.H}, K = {args.K}, V = {args.V}, C = {args.C}"
    print(f"{shape}, {args.threads} thread(s), {args.dtype}, forward, medians of {args.repeats} "
          f"({args.clock} clock)")  # fmt: skip
    print("| n_h | delta rule ms | DeltaProduct ms | ratio | target | over delta_rule on the rows "
          "| unread outputs' share of the ops |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        target = "" if r["target"] is None else f"<= {r['target']}"
        print(f"| {r['n_h']} | {1e3 * r['delta_rule_s']:.1f} | {1e3 * r['delta_product_s']:.1f} | "
              f"{r['ratio']:.2f} | {target} | {r['over_delta_rule_on_rows']:.3f} | "
              f"{r['dropped_output_share']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
