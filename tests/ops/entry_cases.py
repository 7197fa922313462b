"""Valid calls of every public sequence op that takes packed sequences, by name: the tensors of
one call and the op, so that one test covers them all (empty pieces, torch.compile)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import linattn.ops as L

OPS = (
    "linear_attention",
    "delta_rule",
    "generalized_delta_rule",
    "gated_delta_product",
    "comba",
    "rwkv7",
    "gated_deltanet2",
    "rwkv6",
)
H, K, V, N_H = 2, 4, 3, 2  # heads, key and value sizes, DeltaProduct's writes per token


def inputs(op: str, T: int, seed: int = 0, N: int = 1, dtype=torch.float64) -> dict:
    """The tensors of one call of ``op`` with B = 1 and T tokens, by argument name (q, k, v, the
    op's own inputs, and ``initial_state`` [N, H, K, V] for N packed sequences)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    def unif(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64).to(dtype)

    def unit(*shape):
        return F.normalize(rand(*shape), dim=-1)

    rows = T * N_H if op == "gated_delta_product" else T
    x = {"q": rand(1, T, H, K), "k": unit(1, rows, H, K), "v": rand(1, rows, H, V)}
    if op == "delta_rule":
        x.update(beta=2 * unif(1, T, H), g=-unif(1, T, H))
    elif op == "linear_attention":
        x.update(g=-unif(1, T, H, K))
    elif op == "generalized_delta_rule":
        x.update(a=-unit(1, T, H, K), b=unit(1, T, H, K), g=-unif(1, T, H, K))
    elif op == "gated_delta_product":
        x.update(beta=2 * unif(1, rows, H), g=-unif(1, T, H))
    elif op == "comba":
        x.update(p=unit(1, T, H, K), beta=unif(1, T, H), g=-unif(1, T, H))
    elif op == "rwkv7":
        x.update(a=-unit(1, T, H, K), b=unit(1, T, H, K) * unif(1, T, H, 1), g=-unif(1, T, H, K))
    elif op == "gated_deltanet2":
        x.update(g=-unif(1, T, H, K), b=unif(1, T, H, K), w=unif(1, T, H, V))
    else:
        assert op == "rwkv6"
        x.update(g=-unif(1, T, H, K), u=rand(H, K))
    x["initial_state"] = rand(N, H, K, V)
    return x


def call(op: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """``op`` as a function of ``inputs(op, ...)``'s tensors (by name) and its keywords."""

    def run(x: dict, **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
        kw = {"initial_state": x["initial_state"]} | kw
        if op == "delta_rule":
            return L.delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **kw)
        if op == "linear_attention":
            return L.linear_attention(x["q"], x["k"], x["v"], x["g"], **kw)
        if op == "generalized_delta_rule":
            args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["g"])
            return L.generalized_delta_rule(*args, **kw)
        if op == "gated_delta_product":
            args = (x["q"], x["k"], x["v"], x["beta"], x["g"])
            return L.gated_delta_product(*args, num_householder=N_H, **kw)
        if op == "comba":
            return L.comba(x["q"], x["k"], x["v"], x["p"], x["beta"], x["g"], **kw)
        if op == "rwkv7":
            return L.rwkv7(x["q"], x["g"], x["k"], x["v"], x["a"], x["b"], **kw)
        if op == "gated_deltanet2":
            return L.gated_deltanet2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], **kw)
        return L.rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], **kw)

    return run
