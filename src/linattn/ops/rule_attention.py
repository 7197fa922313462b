"""Any registered rule as a public op: its three forms, and its generation step.

``rule_attention`` runs the memory ``S_t = A_t S_{t-1} + k_t w_t^T`` of a rule named in
``linattn.ops.rules`` (a built-in one, or one a user registered), its per-token inputs passed by
the names the rule declares; ``rule_step`` is one token of it on a state. A rule written outside
the package gets through these every form on the PyTorch backend: parallel, recurrent and chunk,
with gradients (its own backward where it writes one, else autograd's), initial and final states
and packed sequences (docs/adding-a-mechanism.md).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _engine, rules
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops.step import _check_out, _check_shapes, _pytorch_step


def rule_attention(
    rule: str | rules.Rule,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    **inputs: Tensor,
) -> tuple[Tensor, Tensor | None]:
    """The memory of ``rule``: S_t = A_t S_{t-1} + k_t w_t^T, o_t = S_t^T (scale q_t).

    The gate g is the diagonal of A_t, applied first (docs/design.md, "Gates"); the rule's
    step (``Rule.write``, ``Rule.entering_write``) is the rest. ``rule_attention("delta", q, k,
    v, g, beta=beta)`` is ``delta_rule(q, k, v, beta, g)``.

    Args:
        rule: a rule's name in ``linattn.ops.rules`` ("additive", "delta", "dplr" or a user's).
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H (grouped value heads).
        g: None, [B, T, HV] or [B, T, HV, K]; a log-decay, every entry <= 0 (-inf: a reset).
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel", "recurrent" or "chunk" (as ``delta_rule``).
        chunk_size: the chunk form's C; None: the rule's own default (``Rule.CHUNK_SIZE``).
        initial_state: [B, HV, K, V] or None (zeros); [N, HV, K, V] with cu_seqlens.
        output_final_state: return the state after the last token (else None).
        cu_seqlens: None or cumulative sequence lengths [N + 1] (B = 1): packed sequences.
        **inputs: the rule's per-token inputs by their declared names (``Rule.INPUTS``):
            [B, T, HV] for a width of 1, [B, T, HV, K] or [B, T, HV, V] otherwise, finite and
            in the declared range.

    Returns:
        o: [B, T, HV, V] in v's dtype; the final state [B, HV, K, V] (or [N, HV, K, V]) in
        float32 (float64 for float64 inputs), or None.
    """
    found = rules.resolve(rule)

    def own(B: int, T: int, HV: int, K: int, V: int) -> None:
        _checks.rule_inputs(found, inputs, B, T, HV, K=K, V=V)

    checked = check_op(
        q, k, v, g, mode=mode, chunk_size=found.CHUNK_SIZE if chunk_size is None else chunk_size,
        scale=scale, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, own=own,
    )  # fmt: skip
    slot = found.pack(inputs, _engine.compute_dtype(q.dtype))  # [B, T, HV(, width)]: one slot
    o, S = _engine.run(
        q, k, v, slot, g,
        scale=scale, mode=mode, chunk_size=checked.chunk_size, initial_state=initial_state,
        cu_seqlens=cu_seqlens, rule=found.NAME, keep_dtype=True,
    )  # fmt: skip
    return o.to(v.dtype), S if checked.output_final_state else None


def rule_step(
    rule: str | rules.Rule,
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    out: Tensor | None = None,
    **inputs: Tensor,
) -> Tensor:
    """One token of ``rule_attention`` on ``state`` [B, HV, K, V], updated in place (or written
    to ``out``, the state left as it was); returns o_t [B, HV, V] in v's dtype.

    q, k: [B, H, K]; v: [B, HV, V]; g: None, [B, HV] or [B, HV, K]; the rule's inputs [B, HV]
    or [B, HV, K | V]. With grad mode on and an input that requires grad, the update is
    recorded (as ``recurrent_step``'s): o_t and the state are differentiable.
    """
    found = rules.resolve(rule)
    B, HV, K, V = _check_shapes(state, q, k, v)
    _check_out(out, state)
    _checks.rule_inputs(found, inputs, B, HV, K=K, V=V, layout="[B, HV")
    _checks.gate(g, B, HV, K, layout="[B, HV]")
    _checks.scale(scale)
    _checks.finite({"state": state, "q": q, "k": k, "v": v})
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    slot = found.pack(inputs, state.dtype)
    given = [x for x in (state, q, k, v, slot, g) if x is not None]
    graph = torch.is_grad_enabled() and any(x.requires_grad for x in given)
    if out is not None and not graph:
        state = out.copy_(state)  # the step in place on out
    return _pytorch_step(state, q, k, v, slot, g, scale, graph, found.NAME, out)
