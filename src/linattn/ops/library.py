"""The chunk form as registered torch.library ops, so that torch.compile and torch.export see it.

Two ops in the namespace ``linattn`` (spec sections 5.1 and 8; the internal layout of
``chunk``: q, k [B, H, T, K], v [B, HV, T, V], beta [B, HV, T], g [B, HV, T, 1 | K];
HV = G H grouped value heads, value head j reading q/k head j // G in place, G = 1 the plain case):

    linattn::chunk_forward(q, k, v, beta?, g?, S0, scale, C, keep, rule, gate) -> (o, S, states)
    linattn::chunk_backward(q, k, v, beta?, g?, states, d_o, dS, scale, C, rule, gate)
        -> (dq, dk, dv, dbeta, dg, dS0)

rule ("additive" | "delta" | "dplr" | "oblique") and gate ("none" | "head" | "channel") are the
mechanism the public op resolved (``Mechanism.of``), passed down in the schema: nothing below
reads it from the tensors, whose presence and widths are checked against it (g [..., 1] for a
gate per head, [..., K] per channel). beta: the rule's per-token inputs: [B, HV, T] for delta,
[B, HV, T, 2K] = [a | b] for dplr (``generalized_delta_rule`` makes it with one cat),
[B, HV, T, K] (the read key r) for oblique, None for additive; dbeta
comes back in its shape (the op splits it into da, db).

The fused C++ loop serves the rules of ``NATIVE_RULES``; the others run the PyTorch loop on
every device and dtype.

o [B, HV, T, V] is a view of a [B, T, HV, V] tensor; S [B, HV, K, V] the final state; states
[ceil(T / C), B HV, K, V] the state entering every chunk (``keep``; else an empty tensor), which the
backward op reads instead of recomputing the recurrence. dbeta and dg are empty tensors where beta
or g is None. Each op has a fake kernel (the shapes and strides of its outputs, no data) and
``chunk_forward`` a registered backward, so that ``chunk`` is one traceable op with its gradient
under ``torch.compile(fullgraph=True)``.

Why ops defined in Python: the C++ extension is compiled lazily, on the first float32 CPU call
(a minute or two), and may be disabled (``LINATTN_NATIVE=0``) or unbuildable. The schema, the
fake kernels and the autograd formula must exist at trace time whatever its state, so they are
defined here at import, and the kernel decides when it runs: the fused C++ loop
(``torch.ops.linattn_native``, ``_native``) for float32 CPU tensors where it is available, the
PyTorch group loop (``chunk.loop_forward``, ``chunk.loop_backward``) for everything else (float64,
GPUs, ``LINATTN_NATIVE=0``). A trace never compiles the extension, and one compiled graph serves
both.

DeltaProduct's query rows (``reads`` = n_h, q with one row per n_h write rows) are an argument
of the C++ kernels only, taken by ``chunk(..., reads=n)`` in eager CPU calls in float32, bfloat16
or float16 (``reads_apply``, ``_QueryRowsChunk``); traced and PyTorch calls repeat q on the write
rows.

Dtypes: float64 throughout, or each of q, k, v, beta, g (and d_o) float32, bfloat16 or float16
with the states (S0, states, dS, S, dS0) float32. The fused loop reads bfloat16 and float16 rows
chunk by chunk into float32 blocks (``csrc/convert.h``: no whole-tensor float32 copy), the
PyTorch loop converts them first; either way o comes back in v's dtype and each gradient in its
input's, rounded once from the float32 arithmetic (docs/design.md, "Layout and dtypes").

Double backward (``create_graph=True``) does not go through ``chunk_backward``, whose kernels
write into buffers autograd cannot record: the registered backward then differentiates the
all-blocks form instead (``chunk.differentiable_backward``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from linattn.dtypes import LOW_DTYPES, compute_dtype
from linattn.ops import _native, rules, tuning
from linattn.ops.chunk import (
    chunk_forward as all_blocks_forward,
)
from linattn.ops.chunk import (
    differentiable_backward,
    loop_backward,
    loop_forward,
)
from linattn.ops.mechanism import GATES, RULES, Mechanism

FLOAT_DTYPES = (torch.float32, torch.float64)  # the compute dtypes (``_engine.compute_dtype``)
# The rules the fused C++ loop computes (``_fused``): csrc/rules/, each; a user's rule runs the
# PyTorch loop.
NATIVE_RULES = tuple(name for name in RULES if rules.named(name).FUSED)
_MECHANISMS = {(rule, gate): Mechanism(rule, gate) for rule in RULES for gate in GATES}


def _like(
    name: str, x: Tensor, q: Tensor, shape: tuple[int, ...], dims: str, state: bool = False
) -> None:
    """x must be a tensor of ``shape`` ([dims]) on q's device, with q's compute dtype: float64
    as q; else float32, bfloat16 or float16 (each input read in its own dtype), and float32 for
    a ``state`` (S0, the states, dS: always the compute dtype)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    dtype = compute_dtype(q.dtype)
    allowed = (dtype,) if state or dtype == torch.float64 else (dtype, *LOW_DTYPES)
    if x.dtype not in allowed or x.device != q.device:
        want = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must be {want} on {q.device} (q is {q.dtype}), got {x.dtype} on "
                        f"{x.device}")  # fmt: skip
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {dims} = {shape}, got {tuple(x.shape)}")


def mechanism(rule: str, gate: str) -> Mechanism:
    """The ``Mechanism`` that the ops' ``rule`` and ``gate`` arguments name (one of nine, made
    once: this runs on every call)."""
    found = _MECHANISMS.get((rule, gate))
    if found is not None:
        return found
    rules.named(rule)  # a registered rule (a user's), else ValueError naming the rules
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    return Mechanism(rule, gate)


def schema_args(mech: Mechanism) -> tuple[str, str]:
    """The ops' ``rule`` and ``gate`` arguments for ``mech``."""
    return mech.rule_name, mech.gate


def _fused(q: Tensor, rule: str) -> bool:
    """Whether the fused C++ loop runs this call: float32 (or bfloat16, float16) CPU tensors, a
    rule it computes."""
    if q.dtype in LOW_DTYPES:
        return rule in NATIVE_RULES and q.device.type == "cpu" and _native.available()
    return rule in NATIVE_RULES and _native.applies(q)


def _upcast(*xs: Tensor | None) -> tuple[Tensor | None, ...]:
    """bfloat16 and float16 tensors of xs in float32 (the others, and None, as they are): the
    PyTorch loop's inputs, which it computes in their dtype."""
    return tuple(x.float() if x is not None and x.dtype in LOW_DTYPES else x for x in xs)


def _downcast(grads, inputs: tuple[Tensor | None, ...]) -> list[Tensor | None]:
    """Each gradient (None: none) in its input's dtype (``_upcast``'s inputs)."""
    return [None if d is None else d.to(x.dtype) for d, x in zip(grads, inputs, strict=True)]


def _check_inputs(
    q, k, v, beta, g, scale: float, C: int, rule: str, gate: str
) -> tuple[int, int, int, int, int, int]:
    """The checks both ops share, before any work (the fake kernels run them too): shapes, one
    dtype and device, the mechanism's beta and g, a finite scale and the chunk size;
    (B, H, HV, T, K, V).

    Grouped value heads: v, beta, g (and the states) have HV = G H heads, q and k H; value head
    j reads q/k head j // G in place (G = 1 the plain case)."""
    if not isinstance(q, Tensor) or q.dtype not in FLOAT_DTYPES + LOW_DTYPES:
        raise TypeError(
            "q must be a float32, float64, bfloat16 or float16 tensor, got "
            f"{getattr(q, 'dtype', q)}"
        )
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, H, T, K], got {tuple(q.shape)}")
    B, H, T, K = q.shape
    _like("k", k, q, (B, H, T, K), "[B, H, T, K]")
    if not isinstance(v, Tensor) or v.dim() != 4:
        raise ValueError("v must be a tensor [B, HV, T, V]")
    HV, V = v.shape[1], v.shape[-1]
    if HV % max(H, 1) or (H == 0 and HV):
        raise ValueError(
            f"v must have shape [B, HV, T, V] with HV a multiple of q's and k's H = {H} "
            f"(grouped value heads), got {tuple(v.shape)}"
        )
    _like("v", v, q, (B, HV, T, V), "[B, HV, T, V]")
    mech = mechanism(rule, gate)
    # beta: the rule's slot, as the rule declares its inputs (``rules.Rule.INPUTS``).
    slot = mech.rule.slot_shape(K, V)
    if (beta is not None) != (slot is not None):
        given = "None" if slot is None else "given"
        raise ValueError(f"beta must be {given} for the {rule} rule")
    if slot is not None:
        _like("beta", beta, q, (B, HV, T, *slot), mech.rule.slot_layout())
    if (g is not None) != mech.decays:
        raise ValueError(f"g must be {'given' if mech.decays else 'None'} for the gate {gate!r}")
    if g is not None:
        width, dims = (1, "[B, HV, T, 1]") if gate == "head" else (K, "[B, HV, T, K]")
        _like("g", g, q, (B, HV, T, width), dims)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if not 1 <= C <= tuning.MAX_CHUNK:
        raise ValueError(f"C (the chunk size) must be in [1, {tuning.MAX_CHUNK}], got {C}")
    return B, H, HV, T, K, V


def tracing(x: Tensor) -> bool:
    """Whether the chunk form is being traced (torch.compile, torch.export, AOT autograd, fake
    tensors) rather than run: then the graph must hold the ops, not their kernels. Tracing runs
    under a dispatch mode (fake, functional, proxy) or on tensor subclasses, eager never."""
    return (
        torch.compiler.is_compiling()
        or bool(_get_current_dispatch_mode_stack())
        or type(x) not in (Tensor, torch.nn.Parameter)
    )


def eager_float32_cpu(*tensors: Tensor | None) -> bool:
    """Whether a family's own compiled chunk kernel (a file of csrc/ that works in float32) serves
    a call on ``tensors`` (None skipped): every one a non-empty float32 CPU tensor, the kernels
    loaded, and the call eager (a trace holds the family's PyTorch ops)."""
    present = [x for x in tensors if x is not None]
    return (
        all(x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() for x in present)
        and _native.applies(present[0])
        and not tracing(present[0])
    )


def _public(x: Tensor | None) -> Tensor | None:
    """x [B, H, T, ...] as a view of a [B, T, H, ...] tensor (the layout the fake kernels give):
    x itself when it is one (or None), else a copy."""
    if x is None or x.transpose(1, 2).is_contiguous():
        return x
    return x.new_empty(x.transpose(1, 2).shape).transpose(1, 2).copy_(x)


def _empty(x: Tensor) -> Tensor:
    return x.new_empty(0)


def forward_kernel(
    q, k, v, beta, g, S0, scale: float, C: int, keep: bool, rule: str, gate: str
) -> tuple:
    """The work of ``chunk_forward`` on checked inputs: the fused C++ loop for float32 CPU
    tensors where it is available (bfloat16 and float16 inputs converted chunk by chunk inside
    it), else the PyTorch group loop (on inputs converted to float32 first). o in v's dtype."""
    if _fused(q, rule):
        return _native.fused("chunk_forward")(q, k, v, beta, g, S0, scale, C, keep, rule, gate)
    dtype = v.dtype
    q, k, v, beta, g = _upcast(q, k, v, beta, g)
    o, S, states = loop_forward(q, k, v, beta, g, S0, scale, C, mechanism(rule, gate), keep)
    return o.to(dtype), S, states


def backward_kernel(
    q,
    k,
    v,
    beta,
    g,
    states,
    d_o,
    dS,
    scale: float,
    C: int,
    rule: str,
    gate: str,
    needs: tuple[bool, ...] = (True,) * 6,
) -> tuple:
    """The work of ``chunk_backward`` on checked inputs (as ``forward_kernel``), with None for
    dbeta without beta and dg without g. The PyTorch loop computes only the gradients ``needs``
    marks (q, k, v, beta, g, S0), None for the others; the fused loop computes all of them."""
    if _fused(q, rule):
        run = _native.fused("chunk_backward")
        dq, dk, dv, dbeta, dg, dS0 = run(q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate)
        return dq, dk, dv, None if beta is None else dbeta, None if g is None else dg, dS0
    mech = mechanism(rule, gate)
    inputs = (q, k, v, beta, g)
    q, k, v, beta, g, d_o = _upcast(q, k, v, beta, g, d_o)
    *grads, dS0 = loop_backward(q, k, v, beta, g, states, d_o, dS, scale, C, mech, tuple(needs))
    return (*(_public(x) for x in _downcast(grads, inputs)), dS0)


@torch.library.custom_op("linattn::chunk_forward", mutates_args=())
def chunk_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    S0: Tensor,
    scale: float,
    C: int,
    keep: bool,
    rule: str,
    gate: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """o, the final state and (keep) the state entering every chunk; see the module docstring."""
    B, _, HV, _, K, V = _check_inputs(q, k, v, beta, g, scale, C, rule, gate)
    _like("S0", S0, q, (B, HV, K, V), "[B, HV, K, V]", state=True)
    return forward_kernel(q, k, v, beta, g, S0, scale, C, keep, rule, gate)


@chunk_forward.register_fake
def _(q, k, v, beta, g, S0, scale, C, keep, rule, gate):
    B, _, HV, T, K, V = _check_inputs(q, k, v, beta, g, scale, C, rule, gate)
    _like("S0", S0, q, (B, HV, K, V), "[B, HV, K, V]", state=True)
    n_chunks = _chunk_count(T, C)
    o = v.new_empty(B, T, HV, V).transpose(1, 2)  # in v's dtype
    states = S0.new_empty(n_chunks, B * HV, K, V) if keep else S0.new_empty(0)
    return o, S0.new_empty(B, HV, K, V), states


def _chunk_count(T: int, C: int) -> int:
    """ceil(T / min(C, T)) chunks (one for T = 0). torch's sym_min and sym_max keep a traced T
    symbolic, where Python's min and max would compare it and specialise the graph to a range."""
    return -(-T // torch.sym_min(C, torch.sym_max(T, 1)))


def _check_backward(
    q, k, v, beta, g, states, d_o, dS, scale: float, C: int, rule: str, gate: str
) -> None:
    B, _, HV, T, K, V = _check_inputs(q, k, v, beta, g, scale, C, rule, gate)
    n_chunks = _chunk_count(T, C)
    _like("states", states, q, (n_chunks, B * HV, K, V), "[ceil(T / C), B HV, K, V]", True)
    _like("d_o", d_o, q, (B, HV, T, V), "[B, HV, T, V]")
    _like("dS", dS, q, (B, HV, K, V), "[B, HV, K, V]", state=True)


@torch.library.custom_op("linattn::chunk_backward", mutates_args=())
def chunk_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    states: Tensor,
    d_o: Tensor,
    dS: Tensor,
    scale: float,
    C: int,
    rule: str,
    gate: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, dbeta (empty without beta), dg (empty without g) and dS0 from the states
    ``chunk_forward`` kept and the gradients d_o, dS of its outputs."""
    args = (q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate)
    _check_backward(*args)
    dq, dk, dv, dbeta, dg, dS0 = backward_kernel(*args)
    dbeta = _empty(q) if dbeta is None else _public(dbeta)  # the fake kernel's layouts
    dg = _empty(q) if dg is None else _public(dg)
    return _public(dq), _public(dk), _public(dv), dbeta, dg, dS0


@chunk_backward.register_fake
def _(q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate):
    _check_backward(q, k, v, beta, g, states, d_o, dS, scale, C, rule, gate)

    def public(x: Tensor) -> Tensor:  # [B, T, H, ...] seen as [B, H, T, ...]
        return x.new_empty(x.transpose(1, 2).shape).transpose(1, 2)

    dbeta = q.new_empty(0) if beta is None else public(beta)
    dg = q.new_empty(0) if g is None else public(g)
    return public(q), public(k), public(v), dbeta, dg, dS.new_empty(dS.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, beta, g, S0, scale, C, _, rule, gate = inputs
    # The mechanism the public op resolved (``Mechanism.of``), as the op's schema passes it.
    ctx.scale, ctx.C, ctx.mech = scale, C, mechanism(rule, gate)
    ctx.save_for_backward(q, k, v, beta, g, S0, output[2])
    ctx.mark_non_differentiable(output[2])
    # Not materialised: autograd would pass a zero tensor of the states' size for their (never
    # used) gradient, 32 MiB filled with zeros on every backward at T = 16,384; ``_backward``
    # makes zeros only for an unused o or S, as autograd did before.
    ctx.set_materialize_grads(False)


_NUMBERS = (None,) * 5  # no gradient for scale, C, keep, rule, gate


def _one_chunk(T: int, C: int) -> bool:
    """Whether an eager call of T tokens is one chunk, whose only entering state is S0."""
    return _chunk_count(T, C) == 1


def _entering_states(q, k, v, beta, g, S0, scale, C, mech, forward, *reads) -> Tensor:
    """The states entering the chunks [ceil(T / C), B HV, K, V] for a backward whose forward
    kept none (eager): S0 itself for one chunk (a view where S0 is contiguous), else the
    forward run again with keep=True."""
    if _one_chunk(k.shape[2], C):
        return S0.reshape(1, -1, *S0.shape[-2:])
    return forward(q, k, v, beta, g, S0, scale, C, True, *mech, *reads)[2]


def _backward(ctx, d_o: Tensor | None, d_S: Tensor | None, _d_states: None) -> tuple:
    q, k, v, beta, g, S0, states = ctx.saved_tensors
    if d_o is None:  # o unused: zeros in its layout, a view of [B, T, HV, V] (v's heads)
        d_o = v.new_zeros(v.shape[0], v.shape[2], v.shape[1], v.shape[-1]).transpose(1, 2)
    if d_S is None:  # the final state unused: zeros, as autograd materialised them
        d_S = torch.zeros(S0.shape, dtype=S0.dtype, device=S0.device)
    if torch.is_grad_enabled():
        # create_graph=True: gradients that can be differentiated again, in float32
        # for bfloat16 and float16 inputs, each returned in its input's dtype.
        inputs = (q, k, v, beta, g)
        up = (*_upcast(q, k, v, beta, g), S0, *_upcast(d_o))
        args = (*up, d_S, ctx.scale, ctx.C, ctx.mech, ctx.needs_input_grad)
        *grads, dS0 = differentiable_backward(*args)
        return (*_downcast(grads, inputs), dS0, *_NUMBERS)
    mech = schema_args(ctx.mech)
    # Traced: the ops, so that the graph holds them; eager: their kernels, without the
    # dispatcher's Python layers around a custom op (a cost per call that a short sequence feels).
    traced = tracing(d_o)
    if states.dim() == 1 and not traced:  # a forward call with keep=False
        states = _entering_states(q, k, v, beta, g, S0, ctx.scale, ctx.C, mech, forward_kernel)
    elif states.dim() == 1:
        _, _, states = chunk_forward(q, k, v, beta, g, S0, ctx.scale, ctx.C, True, *mech)
    args = (q, k, v, beta, g, states, d_o, d_S, ctx.scale, ctx.C, *mech)
    if not traced:  # the loop computes only the gradients needed
        return (*backward_kernel(*args, ctx.needs_input_grad[:6]), *_NUMBERS)
    dq, dk, dv, dbeta, dg, dS0 = chunk_backward(*args)
    dbeta = None if beta is None else dbeta
    dg = None if g is None else dg
    return dq, dk, dv, dbeta, dg, dS0, *_NUMBERS


chunk_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerChunk(torch.autograd.Function):
    """``chunk_forward`` with its registered backward, called without the dispatcher's Python
    layers (eager mode only; the same kernels, context and backward)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = forward_kernel(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_backward)


def reads_apply(q: Tensor, rule: str) -> bool:
    """Whether ``chunk`` can take reads > 1 (query rows fewer than write rows) for this call:
    eager float32, bfloat16 or float16 CPU tensors of a rule the fused C++ loop computes (its
    kernels' ``reads``; a low dtype's query rows spread from their chunk's float32 rows)."""
    return q.dtype in (torch.float32, *LOW_DTYPES) and _fused(q, rule) and not tracing(q)


class _QueryRowsChunk(torch.autograd.Function):
    """The fused chunk loop with R = ``reads`` write rows per query row: q [B, H, T / R, K] and o
    [B, HV, T / R, V], query i read after write row i R + R - 1 (DeltaProduct's n_h writes per
    token, one read), the outputs of the other rows never formed (csrc/kernels.h). Eager CPU
    only (``reads_apply``; each input float32, bfloat16 or float16); the same context and
    gradients as ``_EagerChunk``."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, scale, C, keep, rule, gate, reads):
        kernel = _native.fused("chunk_forward")
        o, S, states = kernel(q, k, v, beta, g, S0, scale, C, keep, rule, gate, reads)
        _setup_context(ctx, (q, k, v, beta, g, S0, scale, C, keep, rule, gate), (o, S, states))
        ctx.reads = reads
        return o, S, states

    @staticmethod
    def backward(ctx, d_o: Tensor | None, d_S: Tensor | None, _d_states: None) -> tuple:
        q, k, v, beta, g, S0, states = ctx.saved_tensors
        R, rule, gate = ctx.reads, *schema_args(ctx.mech)
        if d_o is None:  # o unused: zeros in its layout, a view of [B, T / R, HV, V]
            d_o = v.new_zeros(v.shape[0], q.shape[2], v.shape[1], v.shape[-1]).transpose(1, 2)
        if d_S is None:
            d_S = torch.zeros(S0.shape, dtype=S0.dtype, device=S0.device)
        if torch.is_grad_enabled():  # create_graph=True: on the write rows, q on each of its
            # group's rows, d_o zero on the rows not read (their dq is 0): [B, H(V), T, D]; in
            # float32 for bfloat16 and float16 inputs, each gradient in its input's dtype
            inputs = (q, k, v, beta, g)
            q, k, v, beta, g, d_o = _upcast(q, k, v, beta, g, d_o)
            q_rows = q.repeat_interleave(R, dim=2)
            d_rows = torch.stack([torch.zeros_like(d_o)] * (R - 1) + [d_o], dim=3).flatten(2, 3)
            args = (q_rows, k, v, beta, g, S0, d_rows, d_S, ctx.scale, ctx.C, ctx.mech)
            dq, *grads, dS0 = differentiable_backward(*args, ctx.needs_input_grad)
            dq = None if dq is None else dq.unflatten(2, (-1, R)).sum(3)  # [B, H, T / R, K]
            return *_downcast((dq, *grads), inputs), dS0, *_NUMBERS, None
        if states.dim() == 1:  # a forward call with keep=False
            forward = _native.fused("chunk_forward")
            states = _entering_states(
                q, k, v, beta, g, S0, ctx.scale, ctx.C, (rule, gate), forward, R
            )
        args = (q, k, v, beta, g, states, d_o, d_S, ctx.scale, ctx.C, rule, gate, R)
        dq, dk, dv, dbeta, dg, dS0 = _native.fused("chunk_backward")(*args)
        dbeta, dg = None if beta is None else dbeta, None if g is None else dg
        return dq, dk, dv, dbeta, dg, dS0, *_NUMBERS, None


def chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    chunk_size: int,
    scale: float,
    mech: Mechanism,
    reads: int = 1,
) -> tuple[Tensor, Tensor]:
    """The chunk form of the mechanism ``mech`` as the op ``linattn::chunk_forward`` with its
    backward (internal layout; the public ops have checked the inputs and resolved ``mech``); o
    [B, H, T, V] and the final state. The states of the
    chunks are kept only where a gradient can flow back. Traced (torch.compile, torch.export):
    the op itself; eager: its kernel and backward called directly (``_EagerChunk``), which saves
    the per-call cost of the dispatcher's Python layers around a custom op; eager with
    no graph to record (grad mode off, or no input that requires grad): the kernel alone, without
    the autograd.Function's layers, which a short sequence would pay for nothing.

    ``reads`` = R > 1 (where ``reads_apply``; C a multiple of R): q has T / R rows, read after the
    last of each R write rows, and o [B, HV, T / R, V] (``_QueryRowsChunk``)."""
    B, _, T, K = k.shape
    HV, V = v.shape[1], v.shape[-1]  # grouped value heads: HV = G H
    S0 = initial_state
    if S0 is None:  # in the compute dtype, as a given state
        S0 = q.new_zeros(B, HV, K, V, dtype=compute_dtype(q.dtype))
    inputs = (q, k, v, beta, g, S0)
    keep = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
    # The kernels take chunks of min(C, T) tokens themselves: C is passed as given where it is
    # within their bound, so that a traced T stays symbolic (min(C, T) would specialise it).
    C = chunk_size if chunk_size <= tuning.MAX_CHUNK else min(chunk_size, T)
    if keep and not mech.rule.HAND_WRITTEN and not _fused(q, mech.rule_name):
        # A rule without a PyTorch backward of its own (a user's, or a fused rule whose kernels
        # do not run this call): the all-blocks form, every term recorded by autograd, which
        # differentiates it (in float32 for bfloat16 and float16).
        dtype = v.dtype
        q, k, v, beta, g = _upcast(q, k, v, beta, g)
        o, S = all_blocks_forward(q * scale, k, v, beta, g, S0, chunk_size, mech)
        return o.to(dtype), S
    traced = tracing(q)
    # One chunk, eager: the state entering it is S0, which the context saves anyway; the
    # backward reads it there rather than from a copy the forward would keep beside it (twice
    # the state's memory for every decoding step taken with grad on).
    record, keep = keep, keep and (traced or not _one_chunk(T, C))
    args = (q, k, v, beta, g, S0, float(scale), C, keep, *schema_args(mech))
    if reads > 1:
        o, S, _ = _QueryRowsChunk.apply(*args, reads)
        return o, S
    if traced:
        o, S, _ = chunk_forward(*args)
    elif record:
        o, S, _ = _EagerChunk.apply(*args)
    else:  # no graph to record (as autograd.Function would decide): its kernel alone
        o, S, _ = forward_kernel(*args)
    return o, S
