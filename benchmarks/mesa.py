"""MesaNet's time per token over Gated DeltaNet's chunk form, one thread.

    MesaNet:        H_t = gamma_t H_{t-1} + beta_t k_t k_t^T, G_t likewise with v_t;
                    o_t = G_t^T (H_t + Diag(lambda))^{-1} q_t by fla's conjugate gradients
    Gated DeltaNet: S <- alpha_t S; S <- S + beta_t k_t (v_t - S^T k_t)^T; o_t = S^T q_t

``linattn.ops.mesa.mesa_net`` in its chunk form at fla's default of 30 CG iterations (each a
chunked read of H: Qd H plus the chunk's masked key products) against ``linattn.ops.delta_rule``
with a gate per head, chunk form, on the same inputs: forward (no_grad) and forward + backward,
timed in turns in this process (``medians_in_turns``), time per token. K = V (fla's MesaNet).

    PYTHONPATH=src python benchmarks/mesa.py                         # T = 4096, H = 4, K = 64
    PYTHONPATH=src python benchmarks/mesa.py --T 256 --repeats 1     # a smoke run
"""

from __future__ import annotations

import argparse
import json

import torch

from linattn.experiments import _timing
from linattn.experiments._timing import medians_in_turns
from linattn.ops import delta_rule
from linattn.ops.mesa import mesa_net


def make_inputs(T: int, H: int, K: int, seed: int = 0) -> dict:
    """[1, T, H, K] float32 inputs as fla's MesaNet layer feeds them: unit q and k, beta in
    (0, 1), log-decays near -0.02, lambda 1 (the layer's start)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    unit = torch.nn.functional.normalize
    x = {"q": unit(randn(1, T, H, K), dim=-1), "k": unit(randn(1, T, H, K), dim=-1),
         "v": randn(1, T, H, K), "beta": torch.rand(1, T, H, generator=gen),
         "g": torch.nn.functional.logsigmoid(randn(1, T, H) + 4.0)}  # fmt: skip
    x["lamb"] = torch.ones(H, K)
    return x


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    _timing.use_clock(args.clock)
    x = make_inputs(args.T, args.H, args.K)
    grads = {n: t.clone().requires_grad_(True) for n, t in x.items()}

    def mesa(x=x):
        return mesa_net(x["q"], x["k"], x["v"], x["g"], x["beta"], x["lamb"],
                        chunk_size=args.C, max_cg_iterations=args.iterations)[0]  # fmt: skip

    def gdn(x=x):
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], chunk_size=args.C)[0]

    def backward(fn):
        def run():
            fn(grads).sum().backward()

        return run

    with torch.no_grad():
        gdn()  # the first call builds or loads the C++ kernels
        t_mesa, t_gdn = medians_in_turns([mesa, gdn], args.repeats)
    b_mesa, b_gdn = medians_in_turns([backward(mesa), backward(gdn)], args.repeats)
    per = 1e6 / args.T
    return {
        "forward_us_per_token": {"mesa": t_mesa * per, "gated_deltanet": t_gdn * per},
        "forward_ratio": t_mesa / t_gdn,
        "training_us_per_token": {"mesa": b_mesa * per, "gated_deltanet": b_gdn * per},
        "training_ratio": b_mesa / b_gdn,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--H", type=int, default=4)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--C", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=30, help="CG iterations (fla's 30)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    r = measure(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"T = {args.T}, H = {args.H}, K = V = {args.K}, C = {args.C}, {args.iterations} CG "
          f"iterations, {args.threads} thread(s), float32, medians of {args.repeats} "
          f"({args.clock} clock)")  # fmt: skip
    print("| pass | MesaNet us/token | Gated DeltaNet us/token | ratio |")
    print("|---|---:|---:|---:|")
    for name, key in (("forward", "forward"), ("forward + backward", "training")):
        t = r[f"{key}_us_per_token"]
        print(f"| {name} | {t['mesa']:.2f} | {t['gated_deltanet']:.2f} | {r[f'{key}_ratio']:.1f} |")


if __name__ == "__main__":
    main()
