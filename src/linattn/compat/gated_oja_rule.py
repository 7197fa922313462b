"""fla's gated Oja rule: ``chunk_gated_oja_rule`` and ``fused_recurrent_gated_oja_rule`` (fla 0.6.0
exports them from ``fla.ops.gated_oja_rule`` only, not ``fla.ops``).

    S_t = S_{t-1} Diag(exp gv_t) (I - beta_t v_t v_t^T) + beta_t k_t v_t^T
    o_t = S_t^T (scale q_t)

on ``linattn.ops.gated_oja_rule`` (its own op: the transition acts on the value side). gv
[B, T, HV, V] per value channel (optional in the recurrent entry point), beta [B, T, HV];
states [N, HV, K, V]. ``use_q_l2norm`` / ``use_k_l2norm`` normalise q / k as
``x / sqrt(|x|^2 + 1e-6)``; as in fla, passing the keyword ``use_qk_l2norm_in_kernel`` (whatever
its value) with neither flag set turns both on. fla's recurrent kernel would take a
per-value-channel beta [B, T, HV, V] but multiplies it into a K-vector (valid only for K = V),
so a beta of that shape is refused here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.ops.functional import l2norm
from linattn.ops.gated_oja_rule import gated_oja_rule


def _flags(kwargs: dict, use_q_l2norm: bool, use_k_l2norm: bool) -> tuple[bool, bool]:
    if "use_qk_l2norm_in_kernel" in kwargs and not use_q_l2norm and not use_k_l2norm:
        return True, True
    return use_q_l2norm, use_k_l2norm


def _run(q, k, v, gv, beta, scale, initial_state, output_final_state, cu_seqlens, flags, mode,
         chunk_size):  # fmt: skip
    _core.check(q, k, v, gv=(gv, ("[B, T, HV, V]",)), beta=(beta, ("[B, T, HV]",)))
    _core.check_varlen(q, initial_state, cu_seqlens)
    dtype = _core.promote(q, k, v, gv, beta)
    out_dtype = v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if flags[0]:
        q = l2norm(q)
    if flags[1]:
        k = l2norm(k)
    beta = torch.ones_like(v[..., 0]) if beta is None else beta.to(dtype)
    gv = None if gv is None else gv.to(dtype)
    S0 = _core.state_in(initial_state, dtype, False)
    o, S = gated_oja_rule(
        q, k, v, gv, beta, scale=scale, mode=mode, chunk_size=chunk_size, initial_state=S0,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.to(out_dtype), _core.state_out(S, dtype, False)


def chunk_gated_oja_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gv: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_q_l2norm: bool = False,
    use_k_l2norm: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gated_oja_rule`` (the module docstring); ``chunk_size`` (16, 32 or 64) by
    keyword, other keywords swallowed as in fla."""
    _core.no_head_first(kwargs)
    flags = _flags(kwargs, use_q_l2norm, use_k_l2norm)
    C = _core.check_chunk_size(kwargs.pop("chunk_size", 64), (16, 32, 64), "the gated Oja rule")
    for name, t in (("gv", gv), ("beta", beta)):
        if t is None:
            raise ValueError(f"{name} must be given")
    return _run(
        q, k, v, gv, beta, scale, initial_state, output_final_state, cu_seqlens, flags, "chunk", C
    )


def fused_recurrent_gated_oja_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_q_l2norm: bool = False,
    use_k_l2norm: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gated_oja_rule`` (the module docstring), linattn's recurrent
    form: gv optional (no decay), beta None means ones."""
    flags = _flags(kwargs, use_q_l2norm, use_k_l2norm)
    return _run(
        q, k, v, gv, beta, scale, initial_state, output_final_state, cu_seqlens, flags,
        "recurrent", _core.CHUNK,
    )  # fmt: skip
