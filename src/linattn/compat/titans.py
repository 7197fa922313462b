"""fla's Titans entry point (``fla.ops.titans``): ``chunk_titans_linear``.

Titans' linear memory (``linattn.ops.titans``, oracle ``linattn.reference.titans``; Behrouz et al.
2024) with fla's arguments, all positional as fla's: the head-first layout ``[B, H, T, D]`` for
q, k, v (and ``[B, H, T, 1]`` for theta, alpha, eta), ``w``, ``b`` [H, D] the layer norm's,
``chunk_size`` the tokens sharing a gradient point, ``initial_state`` the memory M [B, H, D, D]
(its momentum starts at zero, as fla's does) or None; returns ``(o [B, H, T, D], M or None)``,
M in float32 (float64 for float64 inputs).

fla's only implementation is PyTorch (``fla.ops.titans.naive``: this name is its chunk form; its
token loop agrees with it), so there is no kernel to follow; its surprise term is kept as written
(``linattn.reference.titans``). fla's chunk form needs T to be a multiple of ``chunk_size`` (its
reshape fails otherwise); here a last chunk may be shorter (the recurrence as defined), and
fla's padded reference ``chunk_titans_linear_ref`` gives the same outputs (its final state then
comes from its zero padding tokens, not from the sequence).
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.titans import titans_linear


def chunk_titans_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    b: Tensor,
    theta: Tensor,
    alpha: Tensor,
    eta: Tensor,
    eps: float,
    chunk_size: int,
    initial_state: Tensor | None,
    output_final_state: bool,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_titans_linear``: ``S_t = eta_t S_{t-1} - 2 theta_t k_t^T u_t(M')``,
    ``M_t = (1 - alpha_t) M_{t-1} + S_t``, ``o_t = q_t M_t + LN_{w,b}(q_t M_t)`` (head-first)."""
    _core.floating_qkv(q, k, v)
    for name, x in (("w", w), ("b", b), ("theta", theta), ("alpha", alpha), ("eta", eta)):
        _core.check_tensor(name, x)
    layouts = {"q": "[B, H, T, D]", "k": "[B, H, T, D]", "v": "[B, H, T, D]",
               "theta": "[B, H, T, 1]", "alpha": "[B, H, T, 1]", "eta": "[B, H, T, 1]"}  # fmt: skip
    tensors = {"q": q, "k": k, "v": v, "theta": theta, "alpha": alpha, "eta": eta}
    for name, x in tensors.items():
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape {layouts[name]}, got {tuple(x.shape)}")
    _core.floating_tensor("initial_state", initial_state)
    dtype = compute_dtype(_core.promote(q, k, v))
    state = None
    if initial_state is not None:
        if initial_state.dim() != 4:
            raise ValueError(
                f"initial_state must have shape [B, H, D, D], got {tuple(initial_state.shape)}"
            )
        M0 = initial_state.to(dtype)
        state = (M0, M0.new_zeros(M0.shape))
    o, S = titans_linear(
        *(x.transpose(1, 2) for x in (q, k, v)), w, b,
        *(x.transpose(1, 2) for x in (theta, alpha, eta)), eps=eps, chunk_size=chunk_size,
        mode="chunk", initial_state=state, output_final_state=output_final_state,
    )  # fmt: skip
    return o.transpose(1, 2), (None if S is None else S[0].to(dtype))
