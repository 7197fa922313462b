"""The gate gradient dg in float32 with steep gates, against float64, in every form and backend.

    PYTHONPATH=src python benchmarks/steep_gate_gradient.py

First the DeltaProduct case that found it (B, T, H, K, V, n_h = 1, 4, 2, 32, 4, 2; unit keys,
beta in [0, 2), g = scale (0.5 + 0.5 U) per head, a random initial state; o.sum() backward),
then the same at steeper gates. Each line: the relative error ||dg_32 - dg_64|| / ||dg_64|| of
the chunk, parallel and recurrent forms in float32 (dg_64: the float64 recurrent form), with the
fused C++ kernels and with the PyTorch loop (LINATTN_NATIVE=0).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

import linattn.ops as L

B, T, H, K, V, N = 1, 4, 2, 32, 4, 2


def case(scale: float, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(B, T * N, H, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(B, T * N, H, V, generator=gen, dtype=torch.float64),
        "beta": 2 * torch.rand(B, T * N, H, generator=gen, dtype=torch.float64),
        "g": scale * (0.5 + 0.5 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)),
        "S0": torch.randn(B, H, K, V, generator=gen, dtype=torch.float64),
    }


def dg(x: dict, dtype: torch.dtype, mode: str) -> torch.Tensor:
    xs = {name: t.to(dtype).clone().requires_grad_() for name, t in x.items()}
    args = (xs["q"], xs["k"], xs["v"], xs["beta"], xs["g"])
    o, _ = L.gated_delta_product(*args, num_householder=N, mode=mode, initial_state=xs["S0"])
    o.sum().backward()
    return xs["g"].grad.double()


def main() -> None:
    print(__doc__.splitlines()[0])
    print(f"torch {torch.__version__}; B, T, H, K, V, n_h = {B}, {T}, {H}, {K}, {V}, {N}")
    for backend in ("fused", "pytorch"):
        os.environ["LINATTN_NATIVE"] = "1" if backend == "fused" else "0"
        for scale in (-5.0, -10.0, -20.0, -30.0):
            errors = {"chunk": 0.0, "parallel": 0.0, "recurrent": 0.0}
            for seed in range(5):
                x = case(scale, seed)
                want = dg(x, torch.float64, "recurrent")
                for mode in errors:
                    got = dg(x, torch.float32, mode)
                    errors[mode] = max(errors[mode], ((got - want).norm() / want.norm()).item())
            line = ", ".join(f"{mode} {e:.1e}" for mode, e in errors.items())
            print(f"{backend:8s} g = {scale:5.1f} (0.5 + 0.5 U), worst of 5 seeds: {line}")


if __name__ == "__main__":
    main()
