"""The delta rule, Gated DeltaNet and Kimi Delta Attention in three forms (sections 7, 8, 10)."""

from __future__ import annotations

from torch import Tensor

from linattn.ops import _engine
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops.functional import l2norm


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The delta rule and its gated forms; o_t = S_t^T (scale q_t), alpha_t = exp(g_t).

    - g None: the delta rule (sections 7, 8),
      S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T;
    - g [B, T, H]: Gated DeltaNet, S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T;
    - g [B, T, H, K]: Kimi Delta Attention,
      S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T.

    The decay is applied first and the error is read from the decayed state. The chunk form solves
    one unit-lower-triangular system per chunk for the pseudo-values (the UT transform, section 8),
    with the decay folded into its masks as cumulative log-gates (no exponential can overflow:
    ``linattn.ops._blockmath``).

    Grouped value heads (Qwen3-Next, Qwen3.5): v, beta, g and the states may have HV = G * H
    heads while q and k have H; value head j then reads q/k head j // G (its state, output and
    gates are its own). HV = H is the plain case.

    Args:
        q, k: [B, T, H, K] (keys used as given unless use_qk_l2norm). v: [B, T, HV, V], HV a
            multiple of H.
        beta: [B, T, HV], in [0, 2] (1 overwrites, 2 is the Householder reflection).
        g: None, [B, T, HV] or [B, T, HV, K]; a log-decay, every entry <= 0, -inf included: a
            reset, alpha = 0 exactly (the state is forgotten at that token).
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel" (the whole sequence as one chunk), "recurrent" (token by token; the
            generation step) or "chunk".
        chunk_size: any int >= 1; used by mode="chunk", whose chunks of min(chunk_size, T)
            tokens may be at most 8192 long (``_engine.MAX_CHUNK``).
        initial_state: [B, HV, K, V] or None (zeros); [N, HV, K, V] with cu_seqlens.
        output_final_state: return the state after the last token (else None).
        cu_seqlens: None or cumulative sequence lengths [N + 1] (B = 1): packed sequences.
        use_qk_l2norm: normalise q and k to unit length along K first (x / sqrt(|x|^2 + 1e-6)).

    Returns:
        o: [B, T, HV, V] in the input dtype; final_state [B, HV, K, V] (or [N, HV, K, V]) in float32
        (float64 for float64 inputs), or None.
    """
    checked = check_op(
        q, k, v, g, mode=mode, chunk_size=chunk_size, scale=scale,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, own=lambda B, T, HV, K, V: _checks.beta(beta, B, T, HV),
    )  # fmt: skip
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("delta_rule", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    if _checks.flag("use_qk_l2norm", use_qk_l2norm):
        dtype = _engine.compute_dtype(q.dtype)
        q, k = l2norm(q.to(dtype)), l2norm(k.to(dtype))
    o, S = _engine.run(
        q,
        k,
        v,
        beta,
        g,
        scale=scale,
        mode=mode,
        chunk_size=checked.chunk_size,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        rule="delta",
        keep_dtype=True,  # o only converted to v's dtype below
    )
    return o.to(v.dtype), S if checked.output_final_state else None
