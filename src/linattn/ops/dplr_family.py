"""The generalized delta rule's named forms: Comba, RWKV-7 and Gated DeltaNet-2.

Each mechanism here is the diagonal-plus-low-rank (DPLR) memory of ``generalized_delta_rule``
with a parametrisation of its own:

    S_t = Diag(exp g_t) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T,    o_t = S_t^T (scale q_t)

(the transition A_t = Diag(exp g_t) + a_t b_t^T; b reads the state entering the token, a is the
direction the read is written along; spec section 8 generalised, the mechanism table of
docs/design.md). A named form
only builds a, b and the write from the mechanism's own inputs and calls
``generalized_delta_rule``: its forms ("chunk", "recurrent", "parallel"), dtypes, ``cu_seqlens``,
initial and final states, grouped value heads and gradients are that op's.

| mechanism        | D_t            | a_t        | b_t                | write          |
|------------------|----------------|------------|--------------------|----------------|
| Comba            | exp(g) I       | -beta k    | p                  | beta v         |
| RWKV-7           | Diag(exp w)    | b (RWKV's) | a (RWKV's)         | v              |
| Gated DeltaNet-2 | Diag(exp g)    | -k         | exp(g) * b * k     | w * v          |

IPLR and DPLR themselves are ``generalized_delta_rule`` with g None or g [B, T, HV, K].
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops.generalized_delta_rule import generalized_delta_rule
from linattn.ops.rules import dplr


def _per_value_head(x: Tensor, HV: int) -> Tensor:
    """x [B, T, H, K] of the q/k heads -> [B, T, HV, K]: value head j reads head j // (HV // H)."""
    H = x.shape[2]
    return x if H == HV or H == 0 else x.repeat_interleave(HV // H, dim=2)


def _on_fla(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, arguments: dict):
    """``op``'s call on fla's kernel where ``linattn.ops.backend`` sends it, after the checks
    ``generalized_delta_rule`` would run on the same call (q, k, v, g: the op's, under its own
    names in ``arguments``, the op's arguments as passed); None: linattn's own path."""
    check_op(
        q, k, v, g, mode=arguments["mode"], chunk_size=arguments["chunk_size"],
        scale=arguments["scale"], output_final_state=arguments["output_final_state"],
        cu_seqlens=arguments["cu_seqlens"], initial_state=arguments["initial_state"],
    )  # fmt: skip
    chosen = _backends.choose(op, q, g, arguments)
    return None if chosen is None else _backends.run(chosen, v.dtype)


def comba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    p: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = dplr.CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Comba (Hu et al. 2025): the gated delta rule with a separate read key p.

        u_t = beta_t (v_t - S_{t-1}^T p_t),    S_t = alpha_t S_{t-1} + k_t u_t^T

    with alpha_t = exp(g_t): A_t = alpha_t I - beta_t k_t p_t^T. The correction reads the state
    entering the token, before its decay, as fla 0.6.0's Triton kernels (``chunk_comba``,
    ``fused_recurrent_comba``) and its ``naive_chunk_comba`` compute it (fla's
    ``naive_recurrent_comba`` reads the decayed state instead, b = exp(g) p, and disagrees with
    fla's kernels). As ``generalized_delta_rule``: a = -beta k, b = p, write beta v, the gate g
    per head. With p = k and g None it is the delta rule.

    Args:
        q, k, p: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H (grouped value heads).
        beta: [B, T, HV]. g: None or [B, T, HV], a log-decay (<= 0, -inf a reset).
        scale, mode, chunk_size, initial_state, output_final_state, cu_seqlens: as
            ``generalized_delta_rule``.

    Returns:
        (o [B, T, HV, V], final state [N, HV, K, V] or None), as ``generalized_delta_rule``.
    """
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v)
    _checks.tensor("p", p, 4)
    if p.shape != k.shape:
        raise ValueError(
            f"p must have k's shape [B, T, H, K] = {tuple(k.shape)}, got {tuple(p.shape)}"
        )
    # beta in [0, 2], as the delta rule's (Comba with p = k and g None is the delta rule), and
    # named before it is folded into v and a, whose checks would name them instead.
    _checks.beta(beta, B, T, HV)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        on_fla = _on_fla("comba", q, k, v, g, locals())
        if on_fla is not None:
            return on_fla
    beta = beta.to(v.dtype).unsqueeze(-1)  # another dtype converted, as the delta rule's beta
    a = -beta * _per_value_head(k, HV)  # [B, T, HV, K]
    return generalized_delta_rule(
        q, k, beta * v, a, _per_value_head(p, HV), g,
        scale=scale, mode=mode, chunk_size=chunk_size, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip


def rwkv7(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    scale: float | None = 1.0,
    mode: str = "chunk",
    chunk_size: int = dplr.CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """RWKV-7 "Goose" (Peng et al. 2025) with the names fla's ``chunk_rwkv7`` takes them:

        S_t = Diag(exp w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,    o_t = S_t^T (scale r_t)

    RWKV-7's a reads the state and its b is the direction written along (the model passes
    a = -kappa_hat and b = kappa_hat * a_gate, its in-context learning rate): the reverse of
    ``generalized_delta_rule``'s names, which this calls as (q=r, k, v, a=b, b=a, g=w).

    Args:
        r, k, a, b: [B, T, H, K]; w: [B, T, H, K], the log-decay (<= 0; RWKV-7 passes
            -exp(-0.5) sigmoid(.), or fla's -softplus(.) - 0.5). v: [B, T, H, V].
        scale: multiplies r; 1.0 by default (RWKV-7 does not scale its receptance; fla's
            ``chunk_rwkv7`` default). None means 1 / sqrt(K).
        mode, chunk_size, initial_state, output_final_state, cu_seqlens: as
            ``generalized_delta_rule``.

    Returns:
        (o [B, T, H, V], final state [N, H, K, V] or None), as ``generalized_delta_rule``.
    """
    B, T, H, HV, K, V = _checks.grouped_qkv(r, k, v, q_name="r")  # r is the op's q
    for name, x in (("a", a), ("b", b)):  # checked under RWKV-7's names (swapped below)
        _checks.vectors(name, x, B, T, HV, K, layout="[B, T, H, K]")
    # a log-decay per key channel (<= 0, -inf a reset), checked under its own name: the op's g
    _checks.gate(w, B, T, HV, K, layout="[B, T, H]", name="w", channel_only=True)
    if _backends.wanted(r):  # the op's arguments by name: none reassigned before this line
        on_fla = _on_fla("rwkv7", r, k, v, w, locals())
        if on_fla is not None:
            return on_fla
    return generalized_delta_rule(
        r, k, v, b, a, w,
        scale=scale, mode=mode, chunk_size=chunk_size, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip


def gated_deltanet2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    b: Tensor,
    w: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = dplr.CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Gated DeltaNet-2 (fla 0.6.0's ``fla.ops.gdn2``): a per-channel erase gate b, a per-channel
    write gate w and a per-channel decay g:

        S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T

    The decay comes first and the erase reads the decayed state, so as ``generalized_delta_rule``
    (whose b reads S_{t-1}): a = -k, b' = exp(g) * b * k, write w * v, the gate g per channel.
    With b = beta (every channel) and w = beta it is KDA.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H (grouped value heads).
        g: [B, T, HV, K], a log-decay (<= 0, -inf a reset). b: [B, T, HV, K]. w: [B, T, HV, V].
        scale, mode, chunk_size, initial_state, output_final_state, cu_seqlens: as
            ``generalized_delta_rule``.

    Returns:
        (o [B, T, HV, V], final state [N, HV, K, V] or None), as ``generalized_delta_rule``.
    """
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v)
    for name, x, last in (("g", g, K), ("b", b, K), ("w", w, V)):
        _checks.tensor(name, x, 4, finite=name != "g")
        if tuple(x.shape) != (B, T, HV, last):
            raise ValueError(
                f"{name} must have shape [B, T, HV, {'V' if name == 'w' else 'K'}] = "
                f"{(B, T, HV, last)}, got {tuple(x.shape)}"
            )
    _checks.gate(g, B, T, HV, K)  # <= 0 before exp(g) enters b
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        on_fla = _on_fla("gated_deltanet2", q, k, v, g, locals())
        if on_fla is not None:
            return on_fla
    k_v = _per_value_head(k, HV)  # [B, T, HV, K]
    # b and w in v's dtype (another converted, as the delta rule's beta): folded into the
    # op's b and v, their dtype would be reported as q, k, v's
    b, w = b.to(v.dtype), w.to(v.dtype)
    return generalized_delta_rule(
        q, k, w * v, -k_v, g.to(v.dtype).exp() * b * k_v, g,
        scale=scale, mode=mode, chunk_size=chunk_size, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
