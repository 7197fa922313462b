"""fla's gated delta rule (Gated DeltaNet): ``chunk_gated_delta_rule`` / ``chunk_gdn`` and
``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_gdn``.

S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (scale q_t) (spec
section 10); g [B, T, HV] before beta in the argument order. Grouped value heads (v, g, beta,
states with HV = G * H heads, Qwen3-Next) and fla's in-kernel options:

- ``use_gate_in_kernel`` with ``A_log`` [HV] (and ``dt_bias`` [HV]): g is the raw input and the
  gate is ``-exp(A_log) * softplus(g + dt_bias)`` (``_core.gdn_gate``);
- ``use_beta_sigmoid_in_kernel``: beta is logits, ``sigmoid(beta)`` (times 2 with
  ``allow_neg_eigval``, which needs the sigmoid);
- ``use_qk_l2norm_in_kernel``: q, k / sqrt(|.|^2 + 1e-6).

The recurrent form also takes ``gk`` [B, T, HV, K] (with g: the gate g + gk) and ``gv``
[B, T, HV, V], and a per-value-channel beta [B, T, HV, V].
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    chunk_indices: Tensor | None = None,
    cp_context: object | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gated_delta_rule`` (the module docstring); ``use_gate_in_kernel``,
    ``A_log``, ``dt_bias`` and ``chunk_size`` (16, 32 or 64) come by keyword, as in fla, and
    other keywords are swallowed (transformers passes ``use_cache``)."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(q, k, v, g=(g, ("[B, T, HV]",)), beta=(beta, ("[B, T, HV]",)))
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q and k must have the same number of heads, but got q.shape[2]={q.shape[2]} and "
            f"k.shape[2]={k.shape[2]}"
        )
    H, HV = q.shape[2], v.shape[2]
    if H and HV % H != 0:
        raise ValueError(
            f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H}), but "
            f"got HV % H = {HV % H}"
        )
    _core.no_head_first(kwargs)
    C = _core.check_chunk_size(kwargs.pop("chunk_size", 64), (16, 32, 64), "Gated Delta Rule")
    _core.check_cp(cp_context)
    use_gate_in_kernel = kwargs.get("use_gate_in_kernel", False)
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    if use_gate_in_kernel and A_log is None:
        raise ValueError("A_log must be provided when use_gate_in_kernel=True.")
    _core.check_neg_eigval(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = (lambda x: _core.gdn_gate(x, A_log, dt_bias)) if use_gate_in_kernel else None
    g, beta = _core.in_kernel(g, beta, gate, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return _core.run(
        q, k, v, delta=True, mode="chunk", beta=beta, g=g, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, chunk_size=C, l2norm=use_qk_l2norm_in_kernel,
        state_v_first=state_v_first, out="q",
    )  # fmt: skip


chunk_gdn = chunk_gated_delta_rule  # fla's alias


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gated_delta_rule``: the token loop (decoding). Positionally
    ``(q, k, v, g, gk, gv, beta)``: pass beta by keyword. beta defaults to ones; the in-kernel
    gate applies to g only (A_log, dt_bias are ignored without ``use_gate_in_kernel``)."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(
        q, k, v, g=(g, ("[B, T, HV]",)), gk=(gk, ("[B, T, HV, K]",)),
        gv=(gv, ("[B, T, HV, V]",)), beta=(beta, ("[B, T, HV]", "[B, T, HV, V]")),
    )  # fmt: skip
    if beta is None:
        beta = torch.ones_like(v[..., 0])
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
        if g is None:
            raise ValueError(
                "`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`."
            )
    _core.check_neg_eigval(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = (lambda x: _core.gdn_gate(x, A_log, dt_bias)) if use_gate_in_kernel else None
    g, beta = _core.in_kernel(g, beta, gate, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return _core.run(
        q, k, v, delta=True, mode="recurrent", beta=beta, g=g, gk=gk, gv=gv, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first,
    )  # fmt: skip


fused_recurrent_gdn = fused_recurrent_gated_delta_rule  # fla's alias
