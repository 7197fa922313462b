"""fla's MesaNet: ``chunk_mesa_net`` (``fla.ops``) and ``mesa_net_decoding_one_step``
(``fla.ops.mesa_net``), on ``linattn.ops.mesa`` (von Oswald et al. 2025; spec section 7.3).

    H_t = exp(g_t) H_{t-1} + beta_t k_t k_t^T,   G_t = exp(g_t) G_{t-1} + beta_t k_t v_t^T
    o_t = G_t^T x_t,  x_t ~ (H_t + Diag(lamb))^{-1} q_t  by ``max_CG_iteration`` CG steps

fla 0.6.0's conventions: q, k, v [B, T, H, K] (v has the keys' width), g, beta [B, T, H], lamb
[H, K]; states h_kk [N, H, K, K] and h_kv [N, H, K, V]; three returns ``(o, h_kk, h_kv)`` (the
states None without ``output_final_state``). The solve is fla's: its chunk kernel and
its ``naive_mesa_net_CG`` start from x_0 = 0, its decoding kernel and
``naive_mesa_net_decoding_one_step`` from Jacobi's guess, all with 1e-5 in both denominators
(``naive_mesa_net_exact`` solves exactly instead; ``linattn.ops.mesa`` with ``cg_eps=0`` reaches
it). fla's kernel casts q and k to float16 before it computes; linattn computes in the
inputs' promoted dtype (float32 at least), so it agrees with fla to float16's rounding only.
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops import checks
from linattn.ops.functional import l2norm
from linattn.ops.mesa import mesa_net, mesa_net_step


def chunk_mesa_net(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    lamb: Tensor,
    h_kk_init: Tensor | None = None,
    h_kv_init: Tensor | None = None,
    output_final_state: bool = False,
    max_CG_iteration: int = 30,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``chunk_mesa_net``: o_t = G_t^T (H_t + Diag(lamb))^{-1} q_t with fla's conjugate
    gradients (module docstring), in chunks of 64. Returns (o, h_kk_final, h_kv_final)."""
    _core.check(q, k, v, g=(g, ("[B, T, H]",)), beta=(beta, ("[B, T, H]",)))
    _core.check_tensor("lamb", lamb)
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"v must have shape [B, T, H, K] = {tuple(q.shape)} (MesaNet's values have the keys' "
            f"width in fla), got {tuple(v.shape)}"
        )
    for name, state in (("h_kk_init", h_kk_init), ("h_kv_init", h_kv_init)):
        if state is not None:
            _core.check_tensor(name, state)
    if cu_seqlens is not None:
        _core.check_varlen(q, None, cu_seqlens)
    use_qk_l2norm_in_kernel = checks.flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    dtype = _core.promote(q, k, v)
    o, h_kk, h_kv = mesa_net(
        q.to(dtype), k.to(dtype), v.to(dtype), g, beta, lamb, mode="chunk",
        chunk_size=_core.CHUNK, h_kk_init=h_kk_init, h_kv_init=h_kv_init,
        output_final_state=output_final_state, max_cg_iterations=max_CG_iteration,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
    state_dtype = compute_dtype(dtype)
    if output_final_state:
        h_kk, h_kv = h_kk.to(state_dtype), h_kv.to(state_dtype)
    return o.to(v.dtype), h_kk, h_kv


def mesa_net_decoding_one_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    lamb: Tensor,
    beta: Tensor,
    prev_h_kk: Tensor,
    prev_h_kv: Tensor,
    max_CG_iteration: int = 30,
) -> tuple[Tensor, Tensor, Tensor]:
    """fla's ``mesa_net_decoding_one_step``: one token, q, k [B, H, K], v [B, H, V], g, beta
    [B, H]; returns (o [B, H, V] in q's dtype, h_kk, h_kv in the previous states' dtype)."""
    o, h_kk, h_kv = mesa_net_step(
        q, k, v, g, lamb, beta, prev_h_kk, prev_h_kv, max_cg_iterations=max_CG_iteration
    )
    return o.to(q.dtype), h_kk.to(prev_h_kk.dtype), h_kv.to(prev_h_kv.dtype)
