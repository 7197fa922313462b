"""The generation step as a public op: one token of any mechanism, the state updated in place.

A decoder keeps one state per layer, ``[B, H, K, V]``, and feeds it one token at a time. The
forms of ``linear_attention`` and ``delta_rule`` accept T = 1 with an initial state, but each call
returns a new state and checks and relayouts whole sequences; ``recurrent_step`` is the lean call
for that loop (spec section 9: the cost of a step is fixed, 4 r d-type work on a fixed state,
whatever the number of tokens seen). Every input is validated before the state is written; the
state itself is checked by the fused step's pass (a non-finite state shows in o_t, so no
state-sized scan comes before it), by one reduction before the PyTorch step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _native, rules
from linattn.ops import checks as _checks
from linattn.ops._bonus import bonus as bonus_term
from linattn.ops.recurrent import step

STATE_DTYPES = (torch.float32, torch.float64)
# The built-in rule a step's keyword inputs name, by what each rule declares (``Rule.INPUTS``),
# resolved once here: keyed by (beta given, a and b given).
_RULE_OF_INPUTS = {
    (False, False): rules.taking(frozenset()).NAME,
    (True, False): rules.taking(frozenset({"beta"})).NAME,
    (False, True): rules.taking(frozenset({"a", "b"})).NAME,
}
# The three, by name, for the fast path (a dict lookup per step is measurable there).
_ADDITIVE, _BETA_RULE, _LOW_RANK = (
    _RULE_OF_INPUTS[False, False],
    _RULE_OF_INPUTS[True, False],
    _RULE_OF_INPUTS[False, True],
)


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
    out: Tensor | None = None,
) -> Tensor:
    """One token of ``S_t = A_t S_{t-1} + k_t w_t^T``, ``o_t = S_t^T (scale q_t)``; S in place.

    The mechanism follows from the arguments, as in the ops (the mechanism table, docs/design.md):

    - beta None: the additive rule, w_t = v_t (linear attention; with g, its decayed forms);
    - beta [B, H]: the delta rule, w_t = beta_t (v_t - S^T k_t) read after the decay (section 7);
    - a, b [B, H, K] (beta None): the generalized delta rule, S_t = (Diag(exp g_t) + a_t b_t^T)
      S_{t-1} + k_t v_t^T, b_t reading the state before the decay (``generalized_delta_rule``);
    - g None: no decay; g [B, H]: S <- exp(g_t) S (scalar decay, Gated DeltaNet); g [B, H, K]:
      S <- Diag(exp g_t) S (per-channel decay, GLA and KDA).

    Grouped value heads: the state, v, beta and g may have HV = G * H heads while q and k have
    H ([B, H, K]); value head j reads q/k head j // G, in place (no copy of q or k).

    Args:
        state: [B, H, K, V] (H: the value heads), float32 or float64; overwritten with S_t
            (without ``out``). A leaf that requires grad is refused (PyTorch cannot update one in
            place): pass ``S0.clone()``.
        q, k: [B, H, K] (H dividing the state's heads); v: [B, H, V] (the state's heads); any
            float dtype, computed in the state's dtype.
        beta: None or [B, H] in [0, 2]. g: None, [B, H] or [B, H, K], every entry <= 0 (-inf: a
            reset, the state forgotten); H the state's (value) heads.
        scale: multiplies q; None means 1 / sqrt(K).
        a, b: None, or both [B, H, K] (finite; H the state's heads): the generalized rule's
            low-rank part (beta then None).
        bonus: None, or RWKV-6's u [H, K] (H the state's heads; finite, any float dtype): the
            read is taken before the additive rule's step (fused or not) updates the state.
        out: None, or a tensor of the state's shape and dtype (contiguous, not overlapping the
            state) that receives S_t, the state left as it was: a step that keeps its input (a
            model's cache committed after its last layer), at the cost of the in-place one (the
            fused step reads the state and writes ``out`` in the same pass).

    Returns:
        o_t: [B, H, V] in v's dtype.

    Speed: float32 CPU tensors of the additive or delta rule with nothing to differentiate take
    a fast path, one C++ call that checks the shapes and the small inputs' values and runs the
    fused step (csrc/step.cpp: each block of the state read and written once, about one pass
    over the state); the state is not scanned for NaN first: a non-finite state shows in o_t
    (the error names the state, after the step).

    Gradients: with grad mode on and any of q, k, v, beta, g (or a non-leaf state) requiring
    grad, the step runs in PyTorch on a copy of the state, and the update ``state.copy_(S_t)``
    (or ``out.copy_``) is recorded: o_t and the state are differentiable with respect to this
    token's inputs and, through the state's history, every earlier step's (as the ops'
    recurrent form). Otherwise (no_grad, or nothing requires grad) the step runs in place, fused
    in C++ for float32 on the CPU.
    """
    if bonus is not None:  # RWKV-6: the read before the write, then the additive rule's step
        o_t = None
    elif a is None and b is None:
        o_t = fused_step(
            state, q, k, v, beta, g, scale, out, _ADDITIVE if beta is None else _BETA_RULE
        )
    elif beta is None and isinstance(a, Tensor) and isinstance(b, Tensor):
        o_t = _fused_low_rank_step(state, q, k, v, a, b, g, scale, out)
    else:
        o_t = None
    if o_t is not None:
        return o_t
    return _checked_step(state, q, k, v, beta, g, scale, a, b, out, bonus)


def _fused_low_rank_step(state, q, k, v, a, b, g, scale, out) -> Tensor | None:
    """``fused_step`` of the generalized rule: a in beta's slot, b apart (the kernel checks both
    and reads them in place: no concatenation per token); None where it does not apply (then
    the checked path names what it refuses)."""
    return fused_step(state, q, k, v, a, g, scale, out, _LOW_RANK, b=b)


def fused_step(state, q, k, v, beta, g, scale, out, rule, gate=None, b=None) -> Tensor | None:
    """The fast path: the fused C++ step for float32 CPU tensors with nothing to differentiate,
    in one call bound with pybind11 (``_native.fast_step``, csrc/python.cpp: through torch.ops
    the parsing of the op's eleven arguments, and the path's own tests in Python, cost more than
    a small step's work), which checks every shape, dtype and small input's value before
    anything is written (one pass over the small inputs, no state-sized scan); o_t. None where
    it does not apply (the extension not loaded yet, another dtype, a graph to record, an empty
    state, a trace) or where the kernel refuses a shape or a type: ``_checked_step`` then runs,
    and names what it refuses. ``rule``: the rule's name, resolved by the caller (the ops'
    ``Mechanism``, or ``recurrent_step`` from the inputs it was given); ``gate``: the mechanism's
    (g then [B, H, 1 | K]), None: from g's shape. ``b``: the dplr rule's b [B, H, K], its a then
    in beta's slot."""
    # The cheapest tests first: this path is the whole per-call cost of a decoding step beside
    # the kernel, which should cost no more than an elementwise op's overhead.
    if not (isinstance(state, Tensor) and state.dtype is torch.float32 and state.is_cpu):
        return None
    kernel = _native.fast_step()  # None: the extension disabled or not loaded yet
    if kernel is None or torch.compiler.is_compiling():
        return None
    if type(scale) not in (float, int, type(None)):  # a bool, a tensor: ``_checks.scale`` says
        return None
    if out is not None and isinstance(out, Tensor) and out.data_ptr() == state.data_ptr():
        return None  # the kernel would step in place; the checked path refuses out on the state
    try:
        o_t = kernel(state, q, k, v, beta, g, scale, rule, gate, out, b)
    except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):
        return None  # refused before any work: the checked path names the argument
    if o_t is not None and o_t.dim() == 1:  # a value out of range: named below (an input:
        _name_the_value_out_of_range(  # the state unchanged)
            state, q, k, v, beta if b is None else torch.cat([beta, b], -1), g
        )
    return o_t


def _name_the_value_out_of_range(state, q, k, v, beta, g) -> None:
    """Raise the error that names the value the fused step found out of range: an input (the
    step did not run), or the state (not finite entering or leaving the step; found in its
    pass, after the step ran)."""
    B, H, K, _ = state.shape
    if beta is not None and beta.dim() == 2:  # the delta rule's; dplr's [a | b] only finite
        _checks.beta(beta, B, H, layout="[B, H]")
    _checks.gate(g, B, H, K, layout="[B, H]")
    low_rank = {} if beta is None or beta.dim() == 2 else {"a, b": beta}
    _checks.finite({"q": q, "k": k, "v": v, **low_rank})
    _checks.finite({"state": state})
    raise ValueError("the step's output o_t is not finite: S^T q overflowed the state's dtype")


def _checked_step(state, q, k, v, beta, g, scale, a, b, out, bonus=None) -> Tensor:
    """The step with every check in Python first, naming the argument it refuses; then the
    fused C++ step (float32 on the CPU, nothing to differentiate) or the PyTorch step."""
    # Types and shapes first (no tensor work), then one reduction for the finiteness of state, q,
    # k and v together and one range pass each for beta and g (which also rejects NaN and Inf
    # there).
    B, H, K, V = _check_shapes(state, q, k, v)
    _check_out(out, state)
    ab = _low_rank(a, b, beta, B, H, K)
    if bonus is not None:
        if out is not None:  # the step on out, from the state
            state = out.copy_(state)
        return _bonus_step(state, q, k, v, beta, g, scale, ab, bonus)
    # tensors only: beta and g are checked below, each named (a list's error, not an attribute's)
    inputs = [x for x in (state, q, k, v, beta, g, ab, out) if isinstance(x, Tensor)]
    graph = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    # Traced (torch.compile): the PyTorch step, whose ops the graph holds; the fused C++ step is
    # no registered op (and loading it takes a lock that dynamo cannot enter).
    fused = not torch.compiler.is_compiling() and all(x.dtype == torch.float32 for x in inputs)
    fused = fused and _native.applies(state)
    fused = fused and state.is_contiguous() and state.numel() > 0 and not graph
    if beta is not None:
        _checks.beta(beta, B, H, layout="[B, H]", values=not fused)
    _checks.gate(g, B, H, K, layout="[B, H]", values=not fused)
    _checks.scale(scale)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    rule = _RULE_OF_INPUTS[beta is not None, ab is not None]
    beta = beta if ab is None else ab  # the rule's inputs: dplr's [a | b] [B, H, 2K]
    if fused:
        # float32 on the CPU: the values' checks and the step in one C++ call (``_native``).
        target, source = (state, None) if out is None else (out, state)
        o_t = _native.recurrent_step(target, q, k, v, beta, g, scale, rule, source)
        if o_t is None:
            _name_the_value_out_of_range(state, q, k, v, beta, g)
        return o_t
    _checks.finite({"state": state, "q": q, "k": k, "v": v})
    if out is not None and not graph:
        state = out.copy_(state)  # the step in place on out
    return _pytorch_step(state, q, k, v, beta, g, scale, graph, rule, out)


def _check_out(out: object, state: Tensor) -> None:
    """out: None, or a tensor of the state's shape, dtype and device, contiguous and apart from
    the state's memory (a leaf that requires grad refused, as the state)."""
    if out is None:
        return
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be None or a tensor, got {type(out).__name__}")
    if out.shape != state.shape or out.dtype != state.dtype or out.device != state.device:
        raise ValueError(
            f"out must be a {state.dtype} tensor of the state's shape {tuple(state.shape)} on "
            f"{state.device}, got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if out.requires_grad and out.is_leaf:
        raise ValueError("out requires grad and is a leaf, which recurrent_step cannot write")
    start, end, nbytes = out.data_ptr(), state.data_ptr(), out.numel() * out.element_size()
    if nbytes and not (start + nbytes <= end or end + nbytes <= start):
        raise ValueError("out must not overlap the state (the step reads one, writes the other)")


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


def _pytorch_step(state, q, k, v, beta, g, scale: float, graph: bool, rule: str, out=None):
    """The step in PyTorch, in place (``graph`` False) or recorded on a copy of the state and
    copied into ``out`` (or the state); ``rule`` by name (beta: the delta rule's [B, H], or
    dplr's [a | b] [B, H, 2K])."""
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
    (state if out is None else out).copy_(S_t)
    return o_t.to(v.dtype)
