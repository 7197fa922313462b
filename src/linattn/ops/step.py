"""The generation step as a public op: one token of any mechanism, the state updated in place.

A decoder keeps one state per layer, ``[B, H, K, V]``, and feeds it one token at a time. The
forms of ``linear_attention`` and ``delta_rule`` accept T = 1 with an initial state, but each call
returns a new state and checks and relayouts whole sequences; ``recurrent_step`` is the lean call
for that loop (spec section 9: the cost of a step is fixed, 4 r d-type work on a fixed state,
whatever the number of tokens seen). Every input is still validated first, the state included.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _native, rules
from linattn.ops import checks as _checks
from linattn.ops.recurrent import step
from linattn.ops.rwkv6 import bonus as bonus_term

STATE_DTYPES = (torch.float32, torch.float64)


def recurrent_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    a: Tensor | None = None,
    b: Tensor | None = None,
    bonus: Tensor | None = None,
) -> Tensor:
    """One token of ``S_t = A_t S_{t-1} + k_t w_t^T``, ``o_t = S_t^T (scale q_t)``; S in place.

    The mechanism follows from the arguments, as in the ops (DESIGN.md's table):

    - beta None: the additive rule, w_t = v_t (linear attention; with g, its decayed forms);
    - beta [B, H]: the delta rule, w_t = beta_t (v_t - S^T k_t) read after the decay (section 7);
    - a, b [B, H, K] (beta None): the generalized delta rule, S_t = (Diag(exp g_t) + a_t b_t^T)
      S_{t-1} + k_t v_t^T, b_t reading the state before the decay (``generalized_delta_rule``);
    - g None: no decay; g [B, H]: S <- exp(g_t) S (scalar decay, Gated DeltaNet); g [B, H, K]:
      S <- Diag(exp g_t) S (per-channel decay, GLA and KDA).

    Grouped value heads: the state, v, beta and g may have HV = G * H heads while q and k have
    H ([B, H, K]); value head j reads q/k head j // G, in place (no copy of q or k).

    Args:
        state: [B, H, K, V] (H: the value heads), float32 or float64; overwritten with S_t. A
            leaf that requires grad is refused (PyTorch cannot update one in place): pass
            ``S0.clone()``.
        q, k: [B, H, K] (H dividing the state's heads); v: [B, H, V] (the state's heads); any
            float dtype, computed in the state's dtype.
        beta: None or [B, H] in [0, 2]. g: None, [B, H] or [B, H, K], every entry <= 0 (-inf: a
            reset, the state forgotten); H the state's (value) heads.
        scale: multiplies q; None means 1 / sqrt(K).
        a, b: None, or both [B, H, K] (finite; H the state's heads): the generalized rule's
            low-rank part (beta then None). Its step runs in PyTorch (no fused step yet).
        bonus: None, or RWKV-6's u [H, K] (H the state's heads; finite, any float dtype): the
            read is taken before the additive rule's step (fused or not) updates the state.

    Returns:
        o_t: [B, H, V] in v's dtype.

    Gradients: with grad mode on and any of q, k, v, beta, g (or a non-leaf state) requiring
    grad, the step runs in PyTorch on a copy of the state, and the update ``state.copy_(S_t)`` is
    recorded: o_t and the state are differentiable with respect to this token's inputs and,
    through the state's history, every earlier step's (as the ops' recurrent form). Otherwise
    (no_grad, or nothing requires grad) the step runs in place, fused in C++ for float32 on the
    CPU.
    """
    # Types and shapes first (no tensor work), then one reduction for the finiteness of state, q,
    # k and v together and one range pass each for beta and g (which also rejects NaN and Inf
    # there): a step is ~50 us of arithmetic, and a check per tensor, each a reduction and a
    # synchronisation, would cost more than the step.
    B, H, K, V = _check_shapes(state, q, k, v)
    ab = _low_rank(a, b, beta, B, H, K)
    if bonus is not None:
        return _bonus_step(state, q, k, v, beta, g, scale, ab, bonus)
    inputs = [x for x in (state, q, k, v, beta, g, ab) if x is not None]
    graph = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    # Traced (torch.compile): the PyTorch step, whose ops the graph holds; the fused C++ step is
    # no registered op (and loading it takes a lock that dynamo cannot enter).
    fused = not torch.compiler.is_compiling() and all(x.dtype == torch.float32 for x in inputs)
    fused = fused and _native.applies(state) and ab is None  # no fused step for dplr
    fused = fused and state.is_contiguous() and state.numel() > 0 and not graph
    if beta is not None:
        _checks.beta(beta, B, H, layout="[B, H]", values=not fused)
    _checks.gate(g, B, H, K, layout="[B, H]", values=not fused)
    _checks.scale(scale)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if fused:
        # float32 on the CPU: the checks and the step in one C++ call (``_native``).
        o_t = _native.recurrent_step(state, q, k, v, beta, g, scale)
        if o_t is not None:
            return o_t
        # An input is out of range: the checks below name it (the state is unchanged).
        if beta is not None:
            _checks.beta(beta, B, H, layout="[B, H]")
        _checks.gate(g, B, H, K, layout="[B, H]")
    _checks.finite({"state": state, "q": q, "k": k, "v": v})
    rule = "dplr" if ab is not None else "additive" if beta is None else "delta"
    return _pytorch_step(state, q, k, v, beta if ab is None else ab, g, scale, graph, rule)


def _bonus_step(state, q, k, v, beta, g, scale, ab, u) -> Tensor:
    """RWKV-6's step: o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t, read from the
    state entering the token, then the additive rule's step (its own read is not used)."""
    B, H, K, _ = state.shape
    if beta is not None or ab is not None:
        raise ValueError(
            "bonus (RWKV-6) is an option of the additive rule: beta, a, b must be None"
        )
    _checks.tensor("bonus", u, 2)
    if tuple(u.shape) != (H, K):
        raise ValueError(f"bonus must have shape [H, K] = {(H, K)}, got {tuple(u.shape)}")
    _checks.gate(g, B, H, K, layout="[B, H]")
    _checks.scale(scale)
    _checks.finite({"state": state, "q": q, "k": k, "v": v})
    factor = 1.0 / math.sqrt(K) if scale is None else float(scale)
    graph = torch.is_grad_enabled() and any(
        x.requires_grad for x in (state, q, k, v, g, u) if x is not None
    )
    # The read saves the state for its backward: a copy (the step then updates it in place).
    S = state.clone() if graph else state
    q_t = q.to(state.dtype) * factor
    groups = (q_t.shape[1], H // max(q_t.shape[1], 1))  # [B, H, K, V] -> [B, Hq, G, K, V]
    o_t = torch.einsum("bhk,bhgkv->bhgv", q_t, S.unflatten(1, groups)).flatten(1, 2)
    o_t = o_t + bonus_term(q, k, v, u, factor, state.dtype)
    recurrent_step(state, q, k, v, None, g, scale=scale)
    return o_t.to(v.dtype)


def _low_rank(a, b, beta, B: int, H: int, K: int) -> Tensor | None:
    """The generalized rule's [a | b] [B, H, 2K] (checked: both or neither, never with beta), or
    None."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise ValueError(f"a and b come together: got {'b' if a is None else 'a'} alone")
    if beta is not None:
        raise ValueError("beta must be None with a and b (the generalized rule has no beta)")
    _checks.vectors("a", a, B, H, K, layout="[B, H, K]")
    _checks.vectors("b", b, B, H, K, layout="[B, H, K]")
    return torch.cat([a, b.to(a.dtype)], dim=-1)


def _check_shapes(state: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int]:
    """The types and shapes of state, q, k, v (no tensor work); (B, H, K, V) of the state."""
    _checks.tensor("state", state, 4, finite=False)
    if state.dtype not in STATE_DTYPES:
        raise TypeError(f"state must be float32 or float64 (the compute dtype), got {state.dtype}")
    if state.requires_grad and state.is_leaf:
        raise ValueError(
            "state requires grad and is a leaf, which recurrent_step cannot update in place; "
            "pass a copy (state.clone()) to differentiate with respect to the initial state"
        )
    B, H, K, V = state.shape  # H: the value heads (HV of grouped value heads)
    _checks.head_sizes("state", K, V)
    _checks.tensor("q", q, 3, finite=False)
    Hq = q.shape[1]  # q's and k's heads: H, or H / groups with grouped value heads
    if not (0 < Hq <= H and H % Hq == 0) and not Hq == H == 0:
        raise ValueError(
            f"q must have shape [B, Hq, K] with Hq dividing the state's H = {H} (grouped value "
            f"heads: value head j reads q/k head j // G), got {tuple(q.shape)}"
        )
    for name, x, heads, size in (("q", q, Hq, K), ("k", k, Hq, K), ("v", v, H, V)):
        _checks.tensor(name, x, 3, finite=False)
        if tuple(x.shape) != (B, heads, size):
            raise ValueError(
                f"{name} must have shape {(B, heads, size)} for a state of shape [B, H, K, V] = "
                f"{tuple(state.shape)} and q of {Hq} heads, got {tuple(x.shape)}"
            )
    return B, H, K, V


def _pytorch_step(state, q, k, v, beta, g, scale: float, graph: bool, rule: str) -> Tensor:
    """The step in PyTorch, in place (``graph`` False) or recorded on a copy of the state;
    ``rule`` by name (beta: the delta rule's [B, H], or dplr's [a | b] [B, H, 2K])."""
    B, H, K, _ = state.shape
    rule = rules.named(rule)  # the rule, resolved once here (``linattn.ops.rules``)
    dtype = state.dtype
    q_t = q.to(dtype) * scale
    k_t, v_t = k.to(dtype), v.to(dtype)
    beta_t = None if beta is None else beta.to(dtype)
    g_t = None if g is None else g.to(dtype).reshape(B, H, K if g.dim() == 3 else 1)  # [B, H, 1|K]
    if not graph:
        o_t, _ = step(state, q_t, k_t, v_t, beta_t, g_t, inplace=True, rule=rule)
        return o_t.to(v.dtype)
    # Differentiable: the step reads a copy (autograd saves it; an in-place update would
    # invalidate what it saved), then the new state is copied into the caller's memory, recorded.
    o_t, S_t = step(state.clone(), q_t, k_t, v_t, beta_t, g_t, rule=rule)
    state.copy_(S_t)
    return o_t.to(v.dtype)
