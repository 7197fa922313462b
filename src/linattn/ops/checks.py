"""Input validation shared by the public ops: every check runs before any work is done.

Each failure is a ``ValueError`` (wrong shape, range, value) or a ``TypeError`` (wrong type or
dtype) whose message names the argument and states what was expected. Under ``torch.compile`` the
values are unknown while the graph is traced: the value checks (ranges, finiteness) are traced into
it instead (``traced``) and raise ``RuntimeError`` with the same message when it runs.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

MODES = ("parallel", "recurrent", "chunk")
FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def compiling() -> bool:
    """Whether torch.compile (or torch.export) is tracing: values are unknown, and are checked by
    ``traced`` instead."""
    return torch.compiler.is_compiling()


def traced(condition: torch.Tensor, message: str) -> None:
    """A value check under torch.compile: ``condition`` (a bool tensor) goes into the graph as
    ``torch._assert_async``, which raises ``RuntimeError(message)`` when the compiled code meets a
    value that fails it (no graph break, no synchronisation at trace time)."""
    torch._assert_async(condition, message)


def tensor(name: str, x: object, ndim: int, finite: bool = True) -> torch.Tensor:
    """``x`` must be a floating tensor with ``ndim`` dimensions and (if ``finite``) finite values.

    ``finite=False`` leaves the values to the caller's range check (``value_range``), which
    also rejects NaN and Inf in the same pass over the tensor.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float64, float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if finite and compiling():
        traced(torch.isfinite(x.detach()).all(), f"{name} contains non-finite values (NaN or Inf)")
    elif finite and not all_finite(x):
        raise ValueError(f"{name} contains non-finite values (NaN or Inf)")
    return x


def shown(x: float, dtype: torch.dtype) -> str:
    """``x`` printed with the fewest digits that tell it apart from its neighbours in ``dtype``.

    A fixed precision (``.3g``) prints 2 + 1 ulp as "2", which makes a refused value look
    allowed; numpy's shortest round-trip repr of the value in the tensor's own precision prints
    "2.0000002" for float32 and "2.0000000000000004" for float64 (bfloat16 and float16 values
    are exact in float32).
    """
    if dtype == torch.float64:
        return repr(float(x))
    return str(np.float32(x))


def value_range(name: str, x: torch.Tensor) -> tuple[float, float]:
    """(min, max) of ``x`` in one pass; raises if any entry is NaN or Inf.

    ``aminmax`` propagates a NaN to both results and an Inf shows as an infinite extreme, so the
    one reduction both checks finiteness and gives the range to check.
    """
    low, high = (float(t) for t in torch.aminmax(x.detach()))
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} contains non-finite values (NaN or Inf)")
    return low, high


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one reduction for the common case.

    A NaN or an Inf makes the sum non-finite, so a finite sum proves every entry finite; a
    non-finite sum (which finite entries can also give, by overflow) is settled by ``no_overflow``.
    This keeps the check of a generation step's state from costing more than the step itself.
    """
    x = x.detach()  # a check, not a computation to differentiate
    return math.isfinite(float(x.sum())) or no_overflow(x)


def no_overflow(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` (not empty) is finite, where its sum was not: its smallest and
    largest entries in one pass (``aminmax`` propagates a NaN to both, an Inf shows as an infinite
    extreme), which can not overflow.

    A float16 sum overflows (65,504) for as few as 65,536 entries near 1; a SiLU output of
    unit-normal inputs (mean 0.21, as the layers' q, k, v after their short convolution) at T 1,024,
    H 8, K 64 sums to about 108,600. ``isfinite(x).all()`` would form a bool tensor of every
    entry first, many times the cost of ``aminmax``'s one pass over them.
    """
    return all(math.isfinite(float(t)) for t in torch.aminmax(x))


def finite(named: dict[str, torch.Tensor]) -> None:
    """Every entry of every tensor is finite; one reduction for all of them in the common case.

    A NaN or an Inf in any tensor makes the sum of their sums non-finite, so a finite total proves
    them all finite; a non-finite total (which finite entries can also give, by overflow) is
    settled tensor by tensor, entry by entry, so that the error names the first bad one.
    """
    if compiling():
        for name, x in named.items():
            traced(
                torch.isfinite(x.detach()).all(), f"{name} contains non-finite values (NaN or Inf)"
            )
        return
    total = sum(x.detach().sum() for x in named.values())
    if math.isfinite(float(total)):
        return
    for name, x in named.items():
        if not all_finite(x):
            raise ValueError(f"{name} contains non-finite values (NaN or Inf)")


def qkv(q: object, k: object, v: object) -> tuple[int, int, int, int, int]:
    """q, k: [B, T, H, K], v: [B, T, H, V], one dtype; returns (B, T, H, K, V)."""
    tensor("q", q, 4)
    tensor("k", k, 4)
    tensor("v", v, 4)
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape [B, T, H, K], got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] with B, T, H = {tuple(q.shape[:3])}, got "
            f"{tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, T, H, K = q.shape
    head_sizes("q, k, v", K, v.shape[3])
    return B, T, H, K, v.shape[3]


def grouped_qkv(
    q: object, k: object, v: object, writes: int = 1, q_name: str = "q"
) -> tuple[int, int, int, int, int, int]:
    """q, k: [B, T, H, K], v: [B, T, HV, V] (grouped value heads; value head j
    reads q/k head j // G), one dtype; returns (B, T, H, HV, K, V). HV = H is the plain case.
    ``writes`` > 1: k and v have T writes rows (DeltaProduct), their shapes checked by the caller
    with its own message (``delta_product.writes_shapes``). ``q_name``: q as the op's user
    passes it (RWKV's r), in every message."""
    tensor(q_name, q, 4)
    tensor("k", k, 4)
    tensor("v", v, 4)
    if writes == 1 and q.shape != k.shape:
        raise ValueError(
            f"{q_name} and k must have the same shape [B, T, H, K], got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    B, T, H, K = q.shape
    HV = v.shape[2]
    if (writes == 1 and v.shape[:2] != q.shape[:2]) or (HV % H if H else HV) != 0:
        raise ValueError(
            f"v must have shape [B, T, HV, V] with B, T = {(B, T)} and HV a multiple of H = {H} "
            f"(grouped value heads: value head j pairs with {q_name}/k head j // (HV // H)), "
            f"got {tuple(v.shape)}"
        )
    names = f"{q_name}, k, v"
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{names} must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    head_sizes(names, K, v.shape[3])
    return B, T, H, HV, K, v.shape[3]


def head_sizes(names: str, K: int, V: int) -> None:
    """K, V >= 1. Empty B, H or T are accepted (empty outputs, as PyTorch's own ops give), but a
    head without key or value channels has no memory and no scale 1 / sqrt(K)."""
    if K < 1 or V < 1:
        raise ValueError(f"{names} must have head sizes K >= 1 and V >= 1, got K = {K}, V = {V}")


def kv(k: object, v: object) -> tuple[int, int, int, int, int]:
    """k: [B, T, H, K], v: [B, T, H, V], one dtype (for ops without queries); returns the sizes."""
    tensor("k", k, 4)
    tensor("v", v, 4)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] with B, T, H = {tuple(k.shape[:3])}, got "
            f"{tuple(v.shape)}"
        )
    if k.dtype != v.dtype:
        raise TypeError(f"k and v must share one dtype, got {k.dtype} and {v.dtype}")
    head_sizes("k, v", k.shape[3], v.shape[3])
    return (*k.shape, v.shape[3])


def gate(
    g: object,
    *sizes: int,
    layout: str = "[B, T, H]",
    values: bool = True,
    name: str = "g",
    channel_only: bool = False,
) -> None:
    """g: None, [B, T, H] (scalar decay per head) or [B, T, H, K] (per channel), all <= 0.

    Any g <= 0 is accepted, -inf included (a reset: alpha = exp(-inf) = 0, the state is forgotten
    at that token); NaN and +inf are refused.

    ``sizes`` are (B, T, H, K); a generation step passes (B, H, K) with ``layout="[B, H]"``.
    ``values=False`` checks the type and shape only (the caller checks the values itself).
    ``name``: the argument as the caller's user passed it (RWKV's ``w``), in every message;
    ``channel_only``: only [..., K] is accepted, and g is required (a gate per key channel, as
    RWKV's: None refused).
    """
    if g is None and not channel_only:
        return
    *lead, K = sizes
    lead = tuple(lead)
    channel = layout[:-1] + ", K]"
    ndim = g.dim() if isinstance(g, torch.Tensor) else 0
    # the rank any (the shape's message says what is wanted), or one of the two ranks
    rank = ndim if channel_only else len(lead) + 1 if ndim == len(lead) + 1 else len(lead)
    tensor(name, g, rank, finite=False)
    if tuple(g.shape) not in (((*lead, K),) if channel_only else (lead, (*lead, K))):
        shapes = f"{channel} = {(*lead, K)}"
        wanted = (
            f"have shape {shapes}" if channel_only else f"be None, {layout} = {lead} or {shapes}"
        )
        raise ValueError(f"{name} must {wanted}, got {tuple(g.shape)}")
    if not values or g.numel() == 0:
        return
    # -inf is accepted: a reset, the decay exp(-inf) = 0 exactly (the state is forgotten there).
    if compiling():
        traced((g.detach() <= 0).all(), f"{name} is a log-decay and must be <= 0 (and not NaN)")
        return
    low, high = (float(t) for t in torch.aminmax(g.detach()))
    if math.isnan(low) or math.isnan(high):
        raise ValueError(f"{name} contains NaN")
    if high > 0:
        raise ValueError(f"{name} is a log-decay and must be <= 0; got max {shown(high, g.dtype)}")


def beta(b: object, *sizes: int, layout: str = "[B, T, H]", values: bool = True) -> None:
    """beta: [B, T, H] with values in [0, 2] (``sizes``; a generation step: [B, H]).

    ``values=False`` checks the type and shape only (the caller checks the values itself).
    """
    tensor("beta", b, len(sizes), finite=False)
    if tuple(b.shape) != sizes:
        raise ValueError(f"beta must have shape {layout} = {sizes}, got {tuple(b.shape)}")
    if not values or b.numel() == 0:
        return
    if compiling():
        b = b.detach()
        traced(((b >= 0) & (b <= 2)).all(), "beta must lie in [0, 2] (and be finite)")
        return
    low, high = value_range("beta", b)
    if low < 0 or high > 2:
        raise ValueError(
            f"beta must lie in [0, 2]; got range [{shown(low, b.dtype)}, {shown(high, b.dtype)}]"
        )


def rule_inputs(
    rule, inputs: dict[str, object], *sizes: int, K: int, V: int, layout: str = "[B, T, HV"
) -> None:
    """A rule's per-token inputs (``rules.Rule.INPUTS``) as its op takes them by name: exactly
    the declared names, each a floating tensor of shape ``sizes`` (+ its width K or V), finite,
    in its declared range. ``layout`` opens the shape's words ("[B, T, HV" or, for a step,
    "[B, HV")."""
    declared = [x.name for x in rule.INPUTS]
    unknown = [name for name in inputs if name not in declared]
    if unknown:
        raise TypeError(
            f"the {rule.NAME} rule takes the inputs {declared}; got unexpected {unknown}"
        )
    missing = [name for name in declared if inputs.get(name) is None]
    if missing:
        raise TypeError(f"the {rule.NAME} rule needs the inputs {declared}; missing {missing}")
    for spec in rule.INPUTS:
        x = inputs[spec.name]
        ranged = spec.low is not None or spec.high is not None
        width = () if spec.width == "1" else (spec.size(K, V),)
        tensor(spec.name, x, len(sizes) + len(width), finite=not ranged)
        shape = (*sizes, *width)
        words = layout + ("]" if not width else f", {spec.width}]")
        if tuple(x.shape) != shape:
            raise ValueError(f"{spec.name} must have shape {words} = {shape}, got {tuple(x.shape)}")
        if not ranged or x.numel() == 0:
            continue
        low, high = value_range(spec.name, x)
        below = spec.low is not None and low < spec.low
        above = spec.high is not None and high > spec.high
        if below or above:
            low_text = "-inf" if spec.low is None else f"{spec.low:g}"
            bounds = f"[{low_text}, {'inf' if spec.high is None else f'{spec.high:g}'}]"
            raise ValueError(
                f"{spec.name} must lie in {bounds}; got range [{shown(low, x.dtype)}, "
                f"{shown(high, x.dtype)}]"
            )


def vectors(name: str, x: object, *sizes: int, layout: str = "[B, T, HV, K]") -> None:
    """A per-token vector of each value head (the generalized rule's a, b): a finite floating
    tensor of shape ``sizes`` (``layout``)."""
    tensor(name, x, len(sizes))
    if tuple(x.shape) != sizes:
        raise ValueError(f"{name} must have shape {layout} = {sizes}, got {tuple(x.shape)}")


def flag(name: str, value: object) -> bool:
    """A yes/no option (``normalize``, ``use_qk_l2norm``, ...): a bool, not merely something truthy.

    PyTorch-like strictness: ``bool`` and ``numpy.bool_`` are accepted; strings ("no" is truthy),
    integers, None and tensors are refused, since ``if value`` would silently read them.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def integer(name: str, value: object) -> int:
    """An integer argument: any integer type (int, numpy and 0-d torch integers, via
    ``operator.index``), never a bool or a float; returned as a Python int."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def options(mode: object, chunk_size: object) -> int:
    """mode in MODES; chunk_size an integer >= 1, returned as a Python int."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    chunk_size = integer("chunk_size", chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return chunk_size


def scale(s: object) -> None:
    """scale: None or a finite real number."""
    if s is None:
        return
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        raise TypeError(f"scale must be None or a float, got {type(s).__name__}")
    if compiling():
        # torch.compile(dynamic=True) traces a float argument as a symbol, whose value is not
        # known here: the check goes into the graph (``traced``)
        traced(torch.isfinite(torch.scalar_tensor(s, dtype=torch.float64)), "scale must be finite")
    elif not math.isfinite(float(s)):
        raise ValueError(f"scale must be finite, got {s}")


def seqlens(cu_seqlens: object, B: int, T: int) -> int:
    """cu_seqlens: None or a 1-D integer tensor 0 = c_0 <= c_1 <= ... <= c_N = T, with B == 1.

    A sequence may be empty (c_n = c_{n+1}), as fla's packed batches allow: it has no output
    rows, and its final state is its initial state. Returns the number of sequences (B when
    cu_seqlens is None).
    """
    if cu_seqlens is None:
        return B
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex:
        raise TypeError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    if B != 1:
        raise ValueError(f"cu_seqlens needs batch size B = 1 (packed sequences), got B = {B}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != T:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at T = {T}, got {cu_seqlens.tolist()}"
        )
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")
    return cu_seqlens.numel() - 1


def state(s: object, N: int, H: int, K: int, V: int) -> None:
    """initial_state: None or [N, H, K, V] (N = B, or the number of sequences with cu_seqlens)."""
    if s is None:
        return
    tensor("initial_state", s, 4)
    if tuple(s.shape) != (N, H, K, V):
        raise ValueError(
            f"initial_state must have shape [N, H, K, V] = {(N, H, K, V)} (N = batch size or "
            f"number of sequences in cu_seqlens), got {tuple(s.shape)}"
        )
