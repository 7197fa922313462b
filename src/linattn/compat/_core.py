"""What every compat entry point shares: fla's checks and conventions around one linattn call.

One call of ``run`` is one of linattn's ops (``linear_attention`` for the additive rule,
``delta_rule`` for the delta rule) with fla's conventions converted on the way in and out:

- dtypes: q, k, v may differ (fla's tests pass q, k in bfloat16 with v in float32); they are
  promoted to one dtype (``torch.promote_types``, with the gates and beta, so that a gate
  computed in float32 is not rounded to bfloat16) and o is returned in q's or v's dtype, as the
  fla function does (``out``); an initial state is read in float32 (float64 for float64).
  Final states are float32 (float64 for float64 inputs: linattn's compute dtype; fla would
  round them to float32).
- states: ``[N, HV, K, V]``, or ``[N, HV, V, K]`` with ``state_v_first=True``.
- grouped value heads (v, beta, g, states with HV = G * H heads): linattn's ops take them.
- gates: ``g`` (per head), ``gk`` (per key channel) and ``gv`` (per value channel) multiply into
  one transition; g and gk together are the per-key-channel gate g + gk.
- ``gv`` and a per-value-channel beta ``[B, T, HV, V]``: the columns of the state evolve
  independently under either rule (S_t's column c depends only on column c of S_{t-1} and on
  v_t[c]), so each value channel c runs as a head of its own with V = 1, gate ``gk + gv[c]`` and
  beta ``beta[c]`` (``split_columns``; exact, V times the heads).
- ``reverse=True``: the recurrence runs from the last token to the first (of each sequence),
  computed on the time-reversed inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops import delta_rule, linear_attention
from linattn.ops.functional import decay_gate, write_strength

CHUNK = 64  # fla's default chunk size


@dataclass(frozen=True)
class OpCall:
    """How a call of linattn's op maps onto a compat function (so onto fla's function of that
    name) where the argument names alone do not say it: ``linattn.dispatch`` inverts compat with
    it to send the op's calls to fla's kernels.

    - ``names``: op argument -> this function's argument, where the two name one thing
      differently (TTT's ``mini_batch_size`` is fla's ``chunk_size``).
    - ``parts``: op argument holding a tuple -> this function's arguments, one per part, in
      order (TTT's state (W, h) is fla's ``initial_state`` and ``initial_state_bias``); None
      gives None to each.
    - ``result``: (this function's return, the op's arguments by name) -> the op's return;
      None: the return as it is (o, or o and the final states).
    """

    names: Mapping[str, str] = field(default_factory=dict)
    parts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    result: Callable | None = None


def inverts(**spec: object) -> Callable:
    """Decorator: record ``OpCall(**spec)`` on a compat function as its ``op_call``."""
    op_call = OpCall(**spec)

    def record(function: Callable) -> Callable:
        function.op_call = op_call
        return function

    return record


def promote(*xs: Tensor | None) -> torch.dtype:
    """The one dtype of q, k, v (and the gates): the promotion of their dtypes."""
    dtype = None
    for x in xs:
        if isinstance(x, Tensor) and x.dtype.is_floating_point:
            dtype = x.dtype if dtype is None else torch.promote_types(dtype, x.dtype)
    return torch.float32 if dtype is None else dtype


def check(
    q: object,
    k: object,
    v: object,
    qkv_names: tuple[str, str, str] = ("q", "k", "v"),
    **named: tuple[object, tuple[str, ...]],
) -> None:
    """fla's argument checks, before any shape is read or broadcast (the ops' own come after).

    q, k: [B, T, H, K] and v: [B, T, HV, V] (HV a multiple of H) floating tensors, named
    ``qkv_names`` (RWKV's r for q); every other argument ``name=(x, layouts)``: None, or a
    floating tensor of one of ``layouts``, written in those sizes ("[B, T, HV]", "[HV]",
    "[B, T, HV, K]", ...). Nothing broadcasts: fla's kernels index every argument by these
    sizes. fla's messages where fla has them.
    """
    for name, x in zip(qkv_names, (q, k, v), strict=True):
        check_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D], got {tuple(x.shape)}")
    if q.shape != k.shape:
        qn, kn = qkv_names[:2]
        raise ValueError(
            f"{qn} and {kn} must have the same shape, got {qn}={q.shape} vs {kn}={k.shape}"
        )
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if v.shape[:2] != (B, T):
        raise ValueError("v must be of shape (batch size, seq len, num of head, head dim).")
    if (HV % H if H else HV) != 0:
        raise ValueError(
            f"v: For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H}), "
            f"but got HV % H = {HV % H if H else HV}"
        )
    sizes = {"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V}
    for name, (x, layouts) in named.items():
        if x is None:
            continue
        check_tensor(name, x)
        shapes = [tuple(sizes[d] for d in layout.strip("[]").split(", ")) for layout in layouts]
        if tuple(x.shape) not in shapes:
            pairs = zip(layouts, shapes, strict=True)
            expected = " or ".join(f"{layout} = {shape}" for layout, shape in pairs)
            raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")


def check_tensor(name: str, x: object) -> None:
    """``x`` must be a floating-point tensor (fla's kernels take no integer q, k, v or gates)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


def check_state(initial_state: object, layout: str = "[N, HV, K, V]") -> None:
    """initial_state: None or a floating tensor of ``layout``'s rank ([N, HV, K, V], or V-first),
    checked before it is converted (an integer or complex state refused, not cast) or
    transposed; the op checks its shape and values."""
    if initial_state is None:
        return
    check_tensor("initial_state", initial_state)
    if initial_state.dim() != layout.count(",") + 1:
        raise ValueError(
            f"initial_state must have shape {layout}, got {tuple(initial_state.shape)}"
        )


def check_varlen(
    q: Tensor,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    state_layout: str = "[N, HV, K, V]",
) -> None:
    """fla's checks of packed sequences: B = 1 and one initial state per sequence (the state's
    type and rank first, ``check_state``, and cu_seqlens itself, before it counts them)."""
    check_state(initial_state, state_layout)
    if cu_seqlens is None:
        return
    if q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: the batch size is expected to be 1 rather than {q.shape[0]} when using "
            "cu_seqlens (flatten variable-length inputs first)"
        )
    # cu_seqlens itself (type, dtype, order, ends) before the states are counted by it
    _checks.seqlens(cu_seqlens, 1, q.shape[1])
    if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(
            f"initial_state: the number of initial states is expected to be equal to the number "
            f"of input sequences, i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}"
        )


def check_cp(cp_context: object) -> None:
    """fla's context parallelism spans devices; linattn has its own (``linattn.distributed``)."""
    if cp_context is not None:
        raise NotImplementedError(
            "cp_context: fla's context parallelism is not implemented by linattn.compat (pass "
            "None; linattn.distributed.context_parallel is linattn's own)"
        )


def check_neg_eigval(allow_neg_eigval: bool, use_beta_sigmoid_in_kernel: bool) -> None:
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")


def in_kernel(g, beta, gate, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
    """(g, beta) as fla's kernels see them when they form them inside: ``gate`` (a function of
    g, or None: g as given) for ``use_gate_in_kernel``, and beta through a sigmoid (times 2 with
    ``allow_neg_eigval``) for ``use_beta_sigmoid_in_kernel``. One place for every family that
    takes these options (Gated DeltaNet's gate, KDA's, ...)."""
    if gate is not None:
        g = gate(g)
    if use_beta_sigmoid_in_kernel:
        beta = sigmoid_beta(beta, allow_neg_eigval)
    return g, beta


def check_chunk_size(chunk_size: object, allowed: tuple[int, ...] | None, what: str) -> int:
    """fla's chunk sizes: ``allowed`` values, or any power of 2 when ``allowed`` is None."""
    if chunk_size is None:
        return CHUNK
    if allowed is None:
        if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
            raise ValueError(f"`chunk_size` must be a power of 2, got {chunk_size}.")
        return chunk_size
    if chunk_size not in allowed:
        choices = ", ".join(str(c) for c in allowed)
        raise ValueError(f"`chunk_size` must be one of {choices} for {what}, got {chunk_size}.")
    return int(chunk_size)


def renamed_layout(kwargs: dict, state_v_first: bool) -> bool:
    """fla's deprecated ``transpose_state_layout`` keyword, renamed ``state_v_first``."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError(
            "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`."
        )
    return bool(kwargs.pop("transpose_state_layout"))


def no_head_first(kwargs: dict) -> None:
    """fla removed ``head_first`` ([B, H, T, D] inputs) and raises when it is passed."""
    if "head_first" in kwargs:
        raise DeprecationWarning(
            "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."
        )


def sigmoid_beta(beta: Tensor, allow_neg_eigval: bool) -> Tensor:
    """``use_beta_sigmoid_in_kernel``: beta = sigmoid(logits), times 2 with allow_neg_eigval."""
    return write_strength(beta.to(compute_dtype(beta.dtype)), allow_neg_eigval)


def gdn_gate(g: Tensor, A_log: Tensor, dt_bias: Tensor | None) -> Tensor:
    """Gated DeltaNet's in-kernel gate: ``-exp(A_log) * softplus(g + dt_bias)``, A_log, dt_bias
    [HV], computed in float32 (float64 stays); g [B, T, HV] is the raw gate input."""
    HV = g.shape[-1] if isinstance(g, Tensor) and g.dim() == 3 else None
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        if p is not None and (not isinstance(p, Tensor) or tuple(p.shape) != (HV,)):
            shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{name} must have shape [HV] = ({HV},) as g [B, T, HV], got {shape}")
    x = g.to(compute_dtype(g.dtype))
    bias = None if dt_bias is None else dt_bias.to(x.dtype)
    return decay_gate(x, A_log.to(x.dtype), bias)


def time_order(T: int, cu_seqlens: Tensor | None, device: torch.device) -> Tensor:
    """The token order of a reverse scan: each sequence's tokens last to first."""
    if cu_seqlens is None:
        return torch.arange(T - 1, -1, -1, device=device)
    bounds = cu_seqlens.tolist()
    parts = [torch.arange(e - 1, s - 1, -1) for s, e in itertools.pairwise(bounds)]
    return torch.cat(parts).to(device)


def total_gate(
    g: Tensor | None, gk: Tensor | None, gv: Tensor | None, V: int
) -> tuple[Tensor | None, bool]:
    """The log-decays g [B, T, HV], gk [B, T, HV, K], gv [B, T, HV, V] as one gate.

    Without gv: g, gk or g + gk (per key channel). With gv: [B, T, HV, V, K'] (K' = K with gk,
    else 1), the gate of each value channel's own head (``split_columns``). The flag says
    whether the result is split per value channel.
    """
    if gv is None:
        if g is not None and gk is not None:
            return g.unsqueeze(-1) + gk, False
        return (gk if gk is not None else g), False
    total = gv.unsqueeze(-1)  # [B, T, HV, V, 1]
    if g is not None:
        total = total + g[..., None, None]
    if gk is not None:
        total = total + gk.unsqueeze(-2)  # [B, T, HV, V, K]
    return total, True


def split_columns(v, beta, gate, S0, V):
    """Each value channel as a head of its own (V = 1): exact, since the columns of S are
    independent under both rules. v [B, T, HV, V] -> [B, T, HV * V, 1], head hv * V + c; q, k
    then pair by grouped heads (head hv * V + c reads q/k head hv // G)."""
    B, T, HV = v.shape[:3]
    v = v.reshape(B, T, HV * V, 1)
    if beta is not None:
        beta = beta.reshape(B, T, HV * V) if beta.dim() == 4 else beta.repeat_interleave(V, 2)
    if gate is not None:
        if gate.dim() == 3:  # g [B, T, HV] shared by every column
            gate = gate.repeat_interleave(V, 2)
        else:  # [B, T, HV, V, K'] -> [B, T, HV * V, K'], or [B, T, HV * V] when K' = 1
            gate = gate.reshape(B, T, HV * V, gate.shape[-1])
            gate = gate.squeeze(-1) if gate.shape[-1] == 1 else gate
    if S0 is not None:
        N, _, K, _ = S0.shape
        S0 = S0.transpose(-1, -2).reshape(N, HV * V, K, 1)  # [N, HV, V, K] -> columns
    return v, beta, gate, S0


def join_columns(o: Tensor, S: Tensor | None, HV: int, V: int):
    """Inverse of ``split_columns`` for o [B, T, HV * V, 1] and S [N, HV * V, K, 1]."""
    B, T = o.shape[:2]
    o = o.reshape(B, T, HV, V)
    if S is not None:
        S = S.reshape(S.shape[0], HV, V, S.shape[2]).transpose(-1, -2)  # [N, HV, K, V]
    return o, S


def state_in(S0: Tensor | None, dtype: torch.dtype, state_v_first: bool) -> Tensor | None:
    """fla's initial state as linattn's: [N, HV, K, V] (from [N, HV, V, K] with
    ``state_v_first``) in the compute dtype (a float32 state stays float32 with bfloat16 inputs)."""
    if S0 is None:
        return None
    S0 = S0.to(compute_dtype(dtype))
    return S0.transpose(-1, -2) if state_v_first else S0  # [N, HV, V, K] -> [N, HV, K, V]


def state_out(S: Tensor | None, dtype: torch.dtype, state_v_first: bool) -> Tensor | None:
    """linattn's final state [N, HV, K, V] as fla's (the inverse of ``state_in``)."""
    if S is None:
        return None
    S = S.transpose(-1, -2) if state_v_first else S
    return S.to(compute_dtype(dtype))


def run(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    delta: bool,
    mode: str,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    chunk_size: int = CHUNK,
    l2norm: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    out: str = "v",
) -> tuple[Tensor, Tensor | None]:
    """One linattn op with fla's conventions (the module docstring); returns (o, final state).

    ``delta`` picks the rule: ``delta_rule`` (beta [B, T, HV] or [B, T, HV, V]) or
    ``linear_attention``; ``out`` is "q" or "v", whose dtype o takes. ``scale`` None means
    1 / sqrt(K).
    """
    check(
        q, k, v, beta=(beta, ("[B, T, HV]", "[B, T, HV, V]")),
        g=(g, ("[B, T, HV]", "[B, T, HV, K]")), gk=(gk, ("[B, T, HV, K]",)),
        gv=(gv, ("[B, T, HV, V]",)),
    )  # fmt: skip
    check_varlen(q, initial_state, cu_seqlens)
    dtype = promote(q, k, v, beta, g, gk, gv)  # an in-kernel gate computed in float32 stays
    out_dtype = q.dtype if out == "q" else v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if beta is not None:
        beta = beta.to(dtype)
    g, gk, gv = (None if x is None else x.to(dtype) for x in (g, gk, gv))
    HV, V = v.shape[2], v.shape[3]
    S0 = state_in(initial_state, dtype, state_v_first)
    gate, split = total_gate(g, gk, gv, V)
    split = split or (beta is not None and beta.dim() == 4)
    if split:
        v, beta, gate, S0 = split_columns(v, beta, gate, S0, V)
    order = None
    if reverse:
        order = time_order(q.shape[1], cu_seqlens, q.device)
        q, k, v = (x.index_select(1, order) for x in (q, k, v))
        beta, gate = (None if x is None else x.index_select(1, order) for x in (beta, gate))
    common = dict(
        scale=scale, mode=mode, chunk_size=chunk_size, initial_state=S0,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if delta:
        o, S = delta_rule(q, k, v, beta, gate, use_qk_l2norm=l2norm, **common)
    else:
        o, S = linear_attention(q, k, v, gate, **common)
    if order is not None:
        o = o.index_select(1, order)  # the reversal is its own inverse
    if split:
        o, S = join_columns(o, S, HV, V)
    return o.to(out_dtype), state_out(S, dtype, state_v_first)


def run_op(
    op: Callable[..., tuple[Tensor, Tensor | None]],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    inputs: dict[str, Tensor | None],
    *,
    mode: str,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    chunk_size: int = CHUNK,
    reverse: bool = False,
    state_v_first: bool = False,
    out: str | torch.dtype = "v",
) -> tuple[Tensor, Tensor | None]:
    """One call of a linattn op ``op(q, k, v, **inputs, scale=, mode=, chunk_size=,
    initial_state=, output_final_state=, cu_seqlens=) -> (o, S)`` with fla's conventions (the
    module docstring): ``inputs`` are the op's per-token tensors [B, T, ...] (or None), promoted
    with q, k, v to one dtype; ``out`` is "q" or "v", whose dtype o takes, or that dtype."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x)  # before promote, which would cast an integer tensor silently
    for name, x in inputs.items():
        floating_tensor(name, x)
    check_varlen(q, initial_state, cu_seqlens)
    dtype = promote(q, k, v, *inputs.values())
    out_dtype = out if isinstance(out, torch.dtype) else q.dtype if out == "q" else v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    inputs = {n: None if x is None else x.to(dtype) for n, x in inputs.items()}
    order = None
    if reverse:
        order = time_order(q.shape[1], cu_seqlens, q.device)
        q, k, v = (x.index_select(1, order) for x in (q, k, v))
        inputs = {n: None if x is None else x.index_select(1, order) for n, x in inputs.items()}
    o, S = op(
        q, k, v, **inputs, scale=scale, mode=mode, chunk_size=chunk_size,
        initial_state=state_in(initial_state, dtype, state_v_first),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if order is not None:
        o = o.index_select(1, order)  # the reversal is its own inverse
    return o.to(out_dtype), state_out(S, dtype, state_v_first)


def floating_tensor(name: str, x: object) -> None:
    """None, or a floating-point tensor (``check_tensor``)."""
    if x is not None:
        check_tensor(name, x)


def floating_qkv(q: object, k: object, v: object) -> None:
    """q, k, v floating-point tensors (``check_tensor``), before an entry point reads their
    shapes."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x)


def check_state_dtype(q: Tensor, initial_state: Tensor | None) -> None:
    """fla asserts a float32 initial state (float64 inputs may keep float64, linattn's own)."""
    if initial_state is None or initial_state.dtype == torch.float32:
        return
    if q.dtype == torch.float64 and initial_state.dtype == torch.float64:
        return
    raise ValueError(f"initial_state must be in float32, got {initial_state.dtype}.")


def chunk_states(run, q, k, v, per_token, S0, cu_seqlens, C, state_v_first):
    """o, the final state and h (the state entering each chunk of each sequence), chunk by
    chunk (fla's ``return_intermediate_states``): ``run(q, k, v, *per_token, S)`` on one chunk
    of one sequence; h [B, NT, HV, K, V] (V-first with state_v_first) in k's dtype."""
    bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    B, HV, K, V = q.shape[0], v.shape[2], k.shape[3], v.shape[3]
    shape = (B, HV, V, K) if state_v_first else (B, HV, K, V)
    outs, finals, h = [], [], []
    for n in range(len(bounds) - 1):
        S = None if S0 is None else (S0 if cu_seqlens is None else S0[n : n + 1])
        for s in range(bounds[n], bounds[n + 1], C):
            e = min(s + C, bounds[n + 1])
            h.append(q.new_zeros(shape, dtype=torch.float32) if S is None else S)
            part = [x[:, s:e] for x in (q, k, v, *per_token)]
            o, S = run(*part, S)
            outs.append(o)
        # a sequence of no token (an empty piece of cu_seqlens) ends in the state it starts in
        finals.append(q.new_zeros(shape, dtype=compute_dtype(q.dtype)) if S is None else S)
    h = torch.stack(h, dim=1).to(k.dtype)  # [B, NT, HV, K, V]
    return torch.cat(outs, dim=1), torch.cat(finals, dim=0), h
