"""Relative RMS error of the fused float32 chunk kernels against float64, forward and backward.

    python benchmarks/gate_accuracy.py [--T 512] [--H 2] [--K 64] [--seed 0]

For each gated mechanism of issue 34 (scalar decay, GLA, Gated DeltaNet, KDA) and three kinds of
gates (``gentle``: the bench's, log sigmoid(normal + 4); ``steep``: those 400 times steeper, so
that the per-channel products halve; ``resets``: gentle with one token in 16 a reset, g = -inf),
the op runs in float32 (the fused C++ kernels) and in float64 on the same (float32-rounded)
inputs; each output and gradient (o, the final state; dq, dk, dv, dbeta, dg) is reported as
``sqrt(mean (x - ref)^2) / sqrt(mean ref^2)`` (``tests/ops/cases.rel_rms``). The figures are for
a before/after table of a kernel change: the same command on both commits, same seed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from linattn.ops import delta_rule, linear_attention

MECHANISMS = {  # name: (rule, gate)
    "scalar_decay": ("additive", "scalar"),
    "gla": ("additive", "channel"),
    "gated_delta": ("delta", "scalar"),
    "kda": ("delta", "channel"),
}


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    """sqrt(mean (x - ref)^2) / sqrt(mean ref^2), in float64."""
    x, ref = x.double(), ref.double()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def make_inputs(rule: str, gate: str, kind: str, T: int, H: int, K: int, seed: int) -> dict:
    """float32 inputs [1, T, H, D] (keys unit vectors, beta in (0, 1)) with gates of ``kind``."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(1, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(1, T, H, K, generator=gen),
    }
    if rule == "delta":
        x["beta"] = torch.sigmoid(torch.randn(1, T, H, generator=gen))
    shape = (1, T, H) if gate == "scalar" else (1, T, H, K)
    g = F.logsigmoid(torch.randn(*shape, generator=gen) + 4.0)
    if kind == "steep":
        g = 400.0 * g
    elif kind == "resets":
        g[:, 5::16] = float("-inf")
    x["g"] = g
    return x


def run(rule: str, x: dict, dtype: torch.dtype) -> dict:
    """Outputs and gradients of the op on ``x`` cast to ``dtype`` (a fixed random dO, dS)."""
    x = {name: t.to(dtype).requires_grad_() for name, t in x.items()}
    if rule == "delta":
        o, S = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], output_final_state=True)
    else:
        o, S = linear_attention(x["q"], x["k"], x["v"], x["g"], output_final_state=True)
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(o.shape, generator=gen).to(dtype)
    dS = torch.randn(S.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad((o * d_o).sum() + (S * dS).sum(), list(x.values()))
    out = {"o": o.detach(), "S": S.detach()}
    out.update({f"d{name}": grad for name, grad in zip(x, grads, strict=True)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=512)
    parser.add_argument("--H", type=int, default=2)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| mechanism | gates | " + " | ".join(("o", "S", "dq", "dk", "dv", "dbeta", "dg")) + " |")
    print("|---|---|" + "---:|" * 7)
    for name, (rule, gate) in MECHANISMS.items():
        for kind in ("gentle", "steep", "resets"):
            x = make_inputs(rule, gate, kind, args.T, args.H, args.K, args.seed)
            found, ref = run(rule, x, torch.float32), run(rule, x, torch.float64)
            cells = [
                f"{rel_rms(found[key], ref[key]):.2e}" if key in found else "-"
                for key in ("o", "S", "dq", "dk", "dv", "dbeta", "dg")
            ]
            print(f"| {name} | {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
