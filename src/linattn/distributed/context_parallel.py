"""Context parallelism: one long sequence split across the ranks of a process group (section 8).

Rank p holds the contiguous slice p of the sequence (slices may differ in length). Because a slice
acts on the state as an affine map S -> M_p S + N_p (``linattn.distributed.maps``), the ranks only
exchange these maps, whose size does not depend on the slice length:

1. every rank checks its inputs and all-gathers a small descriptor; a mismatch across ranks
   (B, H, K, V, dtype, gate kind, whether an initial state is given, its values (a checksum),
   the options that change the result: scale, normalize or use_qk_l2norm; autograd) or bad
   input on any rank raises the same ``ValueError`` on every rank, before any heavy work;
2. every rank computes its slice's map (M_p, N_p);
3. the maps are all-gathered and each rank folds the maps before it into its incoming state,
   S_in(p) = M_{p-1}(... (M_0 S_0 + N_0) ...) + N_{p-1};
4. each rank runs the ordinary op on its slice from ``initial_state=S_in(p)``.

Autograd crosses ranks. Step 3 is one ``torch.autograd.Function`` (``_IncomingState``) whose
backward all-reduces the gradients every rank computed for every map and keeps its own slot: the
gradient of rank p's map is the sum over ranks q > p of what rank q's loss says about it. We do not
use ``torch.distributed.nn.functional.all_gather``: with a plain differentiable all-gather, rank 0
(which folds no maps) and the maps nobody folds would not be on every rank's backward graph, so
the ranks would disagree on whether to run the backward collective and hang. Here every rank's
incoming state depends on the one Function, so each rank runs exactly one backward all-reduce.

Conventions:
- The objective is the sum over ranks of each rank's loss (as with ``DistributedDataParallel``
  every rank must call ``backward`` on a loss that depends on its outputs).
- ``initial_state`` S_0 is replicated: pass the same tensor on every rank. Its gradient is the
  total over ranks, and every rank receives that same total in ``S_0.grad``.
- ``final_state`` on rank p is the state after rank p's slice; on the last rank it is the final
  state of the whole sequence.
- ``cu_seqlens`` (packed sequences) is not supported: one call is one sequence per batch row.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math

import torch
import torch.distributed as dist
from torch import Tensor

from linattn import ops
from linattn.distributed import collectives, maps
from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops import rules
from linattn.ops.mechanism import Mechanism

_DTYPES = {torch.float64: 0, torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
# The fields of the shape descriptor each rank contributes (int64), in order.
_FIELDS = (
    "error", "B", "H", "K", "V", "kind", "dtype", "initial_state", "state_values", "options",
    "grad", "T",
)  # fmt: skip
# What each field that must agree means, for the message that names the disagreement.
_MEANING = {
    "B": "B",
    "H": "H",
    "K": "K",
    "V": "V (with normalize: V + 1)",
    "kind": "mechanism (Mechanism.code: 3 x the rule's index in linattn.ops.rules.names() + the "
    "gate's: none, per head, per channel)",
    "dtype": "dtype",
    "initial_state": "initial state (0 none, 1 given, 2 given with grad)",
    "state_values": "initial_state values (a checksum of its bytes: pass the same S_0 everywhere)",
    "options": "options (a checksum of scale and normalize / use_qk_l2norm)",
    "grad": "whether autograd is on",
}


def checksum(*parts: object) -> int:
    """A signed 64-bit digest (SHA-256, first 8 bytes) of tensors' dtypes, shapes and bytes and of
    other values' reprs: equal on every rank exactly when the parts are.

    ``x + 0`` first turns -0.0 into 0.0, so that equal values give equal bytes (NaN and Inf were
    refused by the checks). A state is [B, H, K, V]: its copy to the CPU is small.
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Tensor):
            t = (part.detach() + 0).cpu().contiguous().view(-1)
            h.update(repr((str(t.dtype), tuple(part.shape))).encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(part).encode())
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def _descriptor(q, v_cols, mech, initial_state, options, needs_grad, error) -> dict[str, int]:
    """This rank's descriptor; ``options``: the values of the options that change the result."""
    if error is not None:
        return dict.fromkeys(_FIELDS, 0) | {"error": 1}
    B, T, H, K = q.shape
    state = 0 if initial_state is None else 1 + int(initial_state.requires_grad and needs_grad)
    scale = options[0]
    options = (1.0 / math.sqrt(K) if scale is None else float(scale), *options[1:])
    return {
        "error": 0,
        "B": B,
        "H": H,
        "K": K,
        "V": v_cols,
        "kind": mech.code,
        "dtype": _DTYPES[q.dtype],
        "initial_state": state,
        "state_values": 0 if initial_state is None else checksum(initial_state),
        "options": checksum(*options),
        "grad": int(needs_grad),
        "T": T,
    }


def _agree(local: dict[str, int], error: str | None, group, device) -> None:
    """Step 1: all-gather the descriptors; raise the same ValueError on every rank on a mismatch."""
    mine = torch.tensor([local[f] for f in _FIELDS], dtype=torch.int64, device=device)
    table = collectives.all_gather(mine, group, name="descriptor").tolist()  # [P, fields]
    rows = [dict(zip(_FIELDS, row, strict=True)) for row in table]
    if any(r["error"] for r in rows):
        messages = collectives.all_gather_strings(error or "", group)
        bad = "; ".join(f"rank {p}: {m}" for p, m in enumerate(messages) if rows[p]["error"])
        raise ValueError(f"invalid input to context-parallel attention ({bad})")
    differ = [f for f in _MEANING if any(r[f] != rows[0][f] for r in rows)]
    if differ:
        seen = "; ".join(
            f"rank {p}: " + ", ".join(f"{f}={r[f]}" for f in differ) for p, r in enumerate(rows)
        )
        raise ValueError(
            "the slices of one context-parallel call must agree across ranks in B, H, K, V, "
            "dtype, gate kind, initial state and its values, scale, normalize / use_qk_l2norm "
            "and whether autograd is on; only T may differ. These differ: "
            f"{'; '.join(_MEANING[f] for f in differ)}. Got {seen}"
        )


def _fold(gathered: Tensor, S0: Tensor, m_shape, n_shape) -> Tensor:
    """Step 3: S <- M_j S + N_j for the packed maps gathered [p, L], oldest first."""
    m_numel = 0 if m_shape is None else math.prod(m_shape)
    S = S0
    for row in gathered:
        M = None if m_shape is None else row[:m_numel].view(m_shape)
        S = maps.apply(M, row[m_numel:].view(n_shape), S)
    return S


class _IncomingState(torch.autograd.Function):
    """packed map of this rank [L], S_0 -> S_in(p); backward: one all-reduce of map gradients."""

    @staticmethod
    def forward(ctx, packed, S0, m_shape, n_shape, group):  # noqa: D102
        rank, world = collectives.rank_and_size(group)
        gathered = collectives.all_gather(packed.detach(), group, name="maps")  # [P, L]
        ctx.save_for_backward(gathered[:rank], S0)
        ctx.meta = (m_shape, n_shape, group, rank, world)
        # A fresh tensor even on rank 0, where the fold is empty and S_in(0) = S_0.
        return _fold(gathered[:rank], S0, m_shape, n_shape).clone()

    @staticmethod
    def backward(ctx, dS):  # noqa: D102
        before, S0 = ctx.saved_tensors
        m_shape, n_shape, group, rank, world = ctx.meta
        L = before.shape[1]  # [rank, L]: the maps of the ranks before this one
        s0_grad = ctx.needs_input_grad[1]
        if rank == 0:
            d_maps, d_s0 = None, dS  # S_in(0) = S_0
        else:
            with torch.enable_grad():
                maps_in = before.detach().requires_grad_()
                s0_in = S0.detach().requires_grad_()
                S = _fold(maps_in, s0_in, m_shape, n_shape)
                d_maps, d_s0 = torch.autograd.grad(S, (maps_in, s0_in), dS, allow_unused=True)
        # One buffer: a slot per rank's map, then S_0's gradient (only if it needs one; the
        # descriptor check made that decision the same on every rank).
        buffer = dS.new_zeros(world * L + (S0.numel() if s0_grad else 0))
        if d_maps is not None:
            buffer[: rank * L] = d_maps.reshape(-1)
        if s0_grad and d_s0 is not None:
            buffer[world * L :] = d_s0.reshape(-1)
        total = collectives.all_reduce_sum(buffer, group, name="map_grads")
        d_packed = total[rank * L : (rank + 1) * L]
        d_S0 = total[world * L :].view_as(S0) if s0_grad else None
        return d_packed, d_S0, None, None, None


def _incoming_state(M: Tensor | None, N: Tensor, S0: Tensor | None, group) -> Tensor:
    """Step 3: all-gather the maps and fold those of the ranks before this one into S_0."""
    packed = N.reshape(-1) if M is None else torch.cat([M.reshape(-1), N.reshape(-1)])
    if S0 is None:
        S0 = N.new_zeros(N.shape)
    m_shape = None if M is None else tuple(M.shape)
    return _IncomingState.apply(packed, S0, m_shape, tuple(N.shape), group)


def _needs_grad(*tensors: Tensor | None) -> bool:
    """Whether this rank's map or S_0 needs a gradient: then it joins the backward all-reduce.

    q is left out on purpose: it reaches only the local op, so it needs no collective.
    """
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in tensors
    )


def _incoming_rule_state(
    inputs: tuple,
    rule: rules.Rule,
    own: dict[str, Tensor],
    check_own,
    options: tuple,
    *,
    mode,
    chunk_size,
    scale,
    initial_state,
    output_final_state,
    group,
    use_qk_l2norm: bool = False,
) -> Tensor:
    """Steps 1-3 for any rule: check this rank's inputs (``check_own(B, T, H, K, V)``: the
    rule's own, ``own`` by their declared names), agree with the other ranks, compute this
    slice's map (M_p: [B, H, K, K] for a rule whose writes read the state, else its diagonal) and
    fold the maps before it.

    ``inputs``: (q, k, v, g) as the public op takes them.
    """
    q, k, v, g = inputs
    error = None
    try:
        _, _, _, K, V = _checks.qkv(q, k, v)
        B, T, H = q.shape[:3]
        check_own(B, T, H, K, V)
        _checks.gate(g, B, T, H, K)
        chunk_size = _checks.options(mode, chunk_size)
        _checks.scale(scale)
        _checks.flag("output_final_state", output_final_state)
        _checks.state(initial_state, B, H, K, V)
    except (ValueError, TypeError) as e:
        error = f"{type(e).__name__}: {e}"
    needs_grad = _needs_grad(k, v, *own.values(), g, initial_state)
    mech = None if error else Mechanism.of(None, g, rule.NAME)
    local = _descriptor(q, 0 if error else V, mech, initial_state, options, needs_grad, error)
    _agree(local, error, group, q.device if isinstance(q, Tensor) else None)
    slot = rule.pack(own, compute_dtype(q.dtype))  # [B, T, H(, width)]: the rule's one slot
    M, N = maps.slice_map(
        k.to(compute_dtype(q.dtype)), v, slot, g, mech,
        chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm,
    )  # fmt: skip
    S0 = None if initial_state is None else initial_state.to(compute_dtype(q.dtype))
    return _incoming_state(M, N, S0, group)


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
    group: dist.ProcessGroup | None = None,
    **inputs: Tensor,
) -> tuple[Tensor, Tensor | None]:
    """Context-parallel ``linattn.ops.rule_attention``: any registered rule (a built-in one or a
    user's), this rank's slice of one long sequence.

    S_t = A_t S_{t-1} + k_t w_t^T, o_t = S_t^T (scale q_t), with the slices' affine maps
    S -> M_p S + N_p (``linattn.distributed.maps``, from the rule's own chunk terms) exchanged
    between ranks (section 8).

    Args:
        rule: a rule's name in ``linattn.ops.rules`` or a registered ``Rule``.
        q, k: [B, T_p, H, K]; v: [B, T_p, H, V]; g: None, [B, T_p, H] or [B, T_p, H, K] (<= 0),
            the same kind on every rank. T_p may differ between ranks.
        scale, mode, chunk_size: as in ``linattn.ops.rule_attention``.
        initial_state: S_0 [B, H, K, V] or None, the same on every rank (gradient summed over
            ranks).
        output_final_state: return the state after this rank's slice.
        group: the process group (None: the default group).
        **inputs: the rule's per-token inputs by their declared names, [B, T_p, H(, width)].

    Returns:
        o [B, T_p, H, V] for this slice, and the state after it (or None).
    """
    found = rules.resolve(rule)
    chunk_size = found.CHUNK_SIZE if chunk_size is None else chunk_size

    def check_own(B: int, T: int, H: int, K: int, V: int) -> None:
        _checks.rule_inputs(found, inputs, B, T, H, K=K, V=V)

    S_in = _incoming_rule_state(
        (q, k, v, g), found, inputs, check_own, (scale,), mode=mode, chunk_size=chunk_size,
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        group=group,
    )  # fmt: skip
    return ops.rule_attention(
        found, q, k, v, g, scale=scale, mode=mode, chunk_size=chunk_size, initial_state=S_in,
        output_final_state=output_final_state, **inputs,
    )  # fmt: skip


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    normalize: bool = False,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Context-parallel ``linattn.ops.linear_attention``: this rank's slice of one long sequence.

    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t) (spec sections 4, 5; decay of
    section 10), with the slices' maps S -> M_p S + N_p exchanged between ranks (section 8).

    Args:
        q, k: [B, T_p, H, K] and v: [B, T_p, H, V]: the tokens of this rank's slice (slice p holds
            the tokens after those of ranks 0..p-1). T_p may differ between ranks.
        g: None, [B, T_p, H] or [B, T_p, H, K] (log-decay <= 0), the same kind on every rank.
        normalize, scale, mode, chunk_size: as in ``linattn.ops.linear_attention`` (mode and
            chunk_size apply to the local computation).
        initial_state: S_0 [B, H, K, V] ([B, H, K, V + 1] with normalize) or None; the same on every
            rank (replicated; its gradient is summed over ranks).
        output_final_state: return the state after this rank's slice.
        group: the process group (None: the default group).

    Returns:
        o [B, T_p, H, V] for this slice; the state after this slice (float32, or float64 for float64
        inputs) or None. Equal to the single-process op on the concatenated sequence.
    """
    error = None
    try:
        _, _, _, K, V = _checks.qkv(q, k, v)
        B, T, H = q.shape[:3]
        _checks.gate(g, B, T, H, K)
        chunk_size = _checks.options(mode, chunk_size)
        _checks.scale(scale)
        normalize = _checks.flag("normalize", normalize)
        _checks.flag("output_final_state", output_final_state)
        _checks.state(initial_state, B, H, K, V + int(normalize))
    except (ValueError, TypeError) as e:
        error = f"{type(e).__name__}: {e}"
    v_cols = 0 if error else V + int(normalize)
    needs_grad = _needs_grad(k, v, g, initial_state)
    options = (scale, "normalize", normalize)
    mech = None if error else Mechanism.of(None, g, "additive")
    local = _descriptor(q, v_cols, mech, initial_state, options, needs_grad, error)
    _agree(local, error, group, q.device if isinstance(q, Tensor) else None)
    # Step 2: this slice's map, in the compute dtype (the ones column is the normaliser's value).
    dtype = compute_dtype(q.dtype)
    values = v.to(dtype)
    if normalize:
        values = torch.cat([values, torch.ones_like(values[..., :1])], dim=-1)  # [B, T, H, V + 1]
    M, N = maps.slice_map(k, values, None, g, mech, chunk_size=chunk_size)
    S0 = None if initial_state is None else initial_state.to(dtype)
    # Steps 3-4.
    S_in = _incoming_state(M, N, S0, group)
    return ops.linear_attention(
        q,
        k,
        v,
        g,
        normalize=normalize,
        scale=scale,
        mode=mode,
        chunk_size=chunk_size,
        initial_state=S_in,
        output_final_state=output_final_state,
    )


def _generated(op, rule_name: str, *, covers: str, map_form: str):
    """The context-parallel version of the public op ``op`` of the rule ``rule_name``: its own
    signature plus ``group``, its own docstring after a paragraph on what the ranks exchange.
    The op's arguments named as the rule's declared inputs (``Rule.INPUTS``) are the rule's;
    every rank checks them as ``rule_attention`` does (steps 1-3), then runs ``op`` on its slice
    from the incoming state (step 4). ``cu_seqlens`` is refused (one call is one sequence)."""
    signature = inspect.signature(op)
    rule = rules.named(rule_name)
    own_names = [spec.name for spec in rule.INPUTS]

    @functools.wraps(op)
    def context_parallel(*args, group: dist.ProcessGroup | None = None, **kwargs):
        x = signature.bind(*args, **kwargs)
        x.apply_defaults()
        x = x.arguments
        if x.get("cu_seqlens") is not None:
            raise ValueError("cu_seqlens (packed sequences) is not supported with context "
                             "parallelism: one call is one sequence per batch row")  # fmt: skip
        own = {name: x[name] for name in own_names}

        def check_own(B: int, T: int, H: int, K: int, V: int) -> None:
            _checks.rule_inputs(rule, own, B, T, H, K=K, V=V)
            if "use_qk_l2norm" in x:
                _checks.flag("use_qk_l2norm", x["use_qk_l2norm"])

        l2 = x.get("use_qk_l2norm") is True  # checked by check_own on every rank first
        options = (x["scale"], *(("use_qk_l2norm", l2) if "use_qk_l2norm" in x else ()))
        S_in = _incoming_rule_state(
            (x["q"], x["k"], x["v"], x["g"]), rule, own, check_own, options, mode=x["mode"],
            chunk_size=x["chunk_size"], scale=x["scale"], initial_state=x["initial_state"],
            output_final_state=x["output_final_state"], group=group, use_qk_l2norm=l2,
        )  # fmt: skip
        return op(**{**x, "initial_state": S_in})

    context_parallel.__signature__ = signature.replace(
        parameters=[
            *signature.parameters.values(),
            inspect.Parameter("group", inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation="dist.ProcessGroup | None"),
        ]
    )  # fmt: skip
    context_parallel.__doc__ = (
        f"Context-parallel ``linattn.ops.{op.__name__}`` ({covers}): this rank's slice of one "
        f"long sequence.\n\n    Each slice's map S -> M_p S + N_p, {map_form}, is exchanged "
        "between ranks (section 8; the module docstring: q, k, v, g and the rule's inputs are\n"
        "    this rank's tokens [B, T_p, ...], T_p may differ between ranks; initial_state is\n"
        "    the same on every rank; ``group``: the process group, None the default; the final\n"
        "    state is the one after this rank's slice). The op's own documentation follows.\n\n"
        f"    {op.__doc__}"
    )
    return context_parallel


delta_rule = _generated(
    ops.delta_rule, "delta", covers="delta rule, Gated DeltaNet, KDA",
    map_form="the compact WY form of prod_t A_t, [B, H, K, K]",
)  # fmt: skip
generalized_delta_rule = _generated(
    ops.generalized_delta_rule, "dplr", covers="IPLR, DPLR, RWKV-7's transition",
    map_form="Diag(exp G) + Ae^T (I - A_ba)^{-1} Bd per chunk (``linattn.ops.rules.dplr``), "
    "[B, H, K, K]",
)  # fmt: skip
