"""fla's ABC (attention with bounded-memory control): ``chunk_abc`` (fla.ops.abc).

Peng et al. 2022: m slots written with weights exp(s_i - z_t) normalised over the prefix
(z_t = log sum_{i <= t} exp(s_i)) and read with a softmax over the slots; ``linattn.ops.slots``
computes it as gated slot attention with ABC's control (``abc_attention``). fla's kernel fixes
scale = 1 / sqrt(K), takes no ``cu_seqlens`` and no grouped heads, and restarts the normaliser
at every call: an initial state enters the first token undecayed (decoding with fla's ABC layer
therefore does not continue the prompt's normaliser; ``linattn.ops.slots.abc_step`` does).

fla's kernel and its naive reference disagree on the final state when T is not a multiple of
the kernel's chunk of 64 tokens: the kernel normalises the last, partial chunk's state by
z = 0 instead of z_T (its load of z_T is masked out), so its final (S_k, S_v) is the true one
times exp(z_T) per slot (S_k's columns, S_v's rows). This function follows the kernel (the
outputs o agree either way); ``linattn.ops.slots.abc_attention`` returns the true state.
fla's kernel has no backward for the states: it returns no gradient for an initial state and
leaves its term out of s's; here the gradients are autograd's of the forward above (those of
fla's naive reference; without an initial state, the kernel's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.gsa import run


def chunk_abc(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    initial_state: tuple[Tensor, Tensor] | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """fla's ``chunk_abc``: q, k [B, T, H, K], v [B, T, H, V], s [B, T, H, M] slot logits;
    initial_state None or (S_k [B, H, K, M], S_v [B, H, M, V]). Returns (o [B, T, H, V] in v's
    dtype, (S_k, S_v) or None), linattn's chunk form (chunks of 64)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("s", s)):
        _core.check_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D], got {tuple(x.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got q={q.shape} vs k={k.shape}")
    for name, x in (("v", v), ("s", s)):
        if x.shape[:3] != q.shape[:3]:
            raise ValueError(
                f"{name} must have shape [B, T, H, D] with B, T, H = {tuple(q.shape[:3])}, got "
                f"{tuple(x.shape)}"
            )
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise TypeError(
                "initial_state must be None or a pair (S_k [B, H, K, M], S_v [B, H, M, V])"
            )
        for name, S in zip(("S_k", "S_v"), initial_state, strict=True):
            _core.floating_tensor(f"initial_state's {name}", S)
    o, final = run(
        q, k, v, s, None, None, initial_state, output_final_state, None, "chunk", _core.CHUNK,
        v.dtype,
    )  # fmt: skip
    if not output_final_state:
        return o, None
    Sk, Sv = final
    T = q.shape[1]
    if T % _core.CHUNK:  # fla's kernel: the last, partial chunk normalised by z = 0 (docstring)
        z = torch.logsumexp(s.to(Sk.dtype), dim=1)  # z_T [B, H, M]
        Sk, Sv = Sk * torch.exp(z).unsqueeze(-2), Sv * torch.exp(z).unsqueeze(-1)
    return o, (Sk, Sv)
