"""The dispatch shared by the public ops: dtype, layout, scale, mode and packed sequences.

Public layout [B, T, H, D] -> internal [B, H, T, D] in the compute dtype (float64 for float64
inputs, float32 otherwise; ``_layout.to_internal``), so that states and cumulative gates accumulate
in float32 at least. The mechanism is resolved here, once (``Mechanism.of``), and passed down.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype  # ``_engine.compute_dtype``, for the ops too
from linattn.ops import _native, _packed
from linattn.ops._layout import to_internal
from linattn.ops.library import chunk
from linattn.ops.mechanism import Mechanism
from linattn.ops.parallel import parallel_forward
from linattn.ops.recurrent import recurrent_forward
from linattn.ops.step import fused_step
from linattn.ops.tuning import DECODE_TOKENS, MAX_CHUNK


def check_chunk(chunk_size: int, lengths: list[int]) -> None:
    """Refuse a chunk of more than ``MAX_CHUNK`` tokens (``min(chunk_size, T)`` for the longest of
    the sequences' ``lengths``) before any work, naming ``chunk_size``.

    A chunk_size within the bound needs no length: the common case reads no T, so that
    torch.compile(dynamic=True) keeps T symbolic without a guard on it (and dynamo cannot trace
    ``max(..., default=)``).
    """
    if chunk_size <= MAX_CHUNK or not lengths:
        return
    C = min(chunk_size, max(lengths))
    if C > MAX_CHUNK:
        raise ValueError(
            f"chunk_size: the chunk form computes min(chunk_size, T) = {C} tokens at once, with "
            f"{C} x {C} blocks; at most {MAX_CHUNK} (pass a smaller chunk_size, e.g. 64)"
        )


def forward(
    mode: str,
    mech: Mechanism,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    chunk_size: int,
    scale: float,
    reads: int = 1,
) -> tuple[Tensor, Tensor]:
    """One batch of equal-length sequences in the internal layout, in the chosen form.

    The chunk form takes q unscaled and the scale (it folds the scale into its per-group copy of
    q, which saves a whole-sequence copy); the other forms take q already scaled. ``reads`` > 1:
    q's rows are one per ``reads`` write rows (``library.chunk``; the chunk form only).
    """
    if 0 in k.shape[:3] or v.shape[1] == 0:
        return empty_forward(q, k, v, beta, g, initial_state)
    if mode == "chunk":
        # A registered op: its schema carries the mechanism (rule and gate).
        return chunk(q, k, v, beta, g, initial_state, chunk_size, scale, mech, reads)
    if mode == "recurrent" and q.shape[2] <= DECODE_TOKENS and initial_state is not None:
        decoded = decode(mech, q, k, v, beta, g, initial_state, scale)
        if decoded is not None:
            return decoded
    q = q * scale
    if mode == "recurrent":
        return recurrent_forward(q, k, v, beta, g, initial_state, mech)
    return parallel_forward(q, k, v, beta, g, initial_state, mech)


def decode(
    mech: Mechanism,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    S0: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor] | None:
    """A few tokens from a state (T <= ``tuning.DECODE_TOKENS``: a decoding step, the layers'
    and models' cached forward) as the fused step token by token (``step.fused_step``,
    csrc/step.cpp): the first reads S0 and writes a new state in the same pass (S0 is not
    changed), the others update it in place, each about one pass over the state; (o
    [B, HV, T, V], S). None where it does not serve the call (not float32 on the CPU, a
    gradient to record): the recurrent form then runs. The dplr rule's [a | b] travels in
    beta's slot, as in the chunk op."""
    if not _native.applies(q):
        return None
    S = torch.empty(S0.shape, dtype=S0.dtype, device=S0.device)
    outputs, source = [], S0
    for t in range(q.shape[2]):
        token = [None if x is None else x[:, :, t] for x in (q, k, v, beta, g)]  # [B, H, ...]
        out = None if source is S else S
        o_t = fused_step(source, *token, scale, out, mech.rule_name, mech.gate)
        if o_t is None:
            return None  # refused before any work (checked above): the recurrent form runs
        outputs.append(o_t)
        source = S
    return torch.stack(outputs, dim=2), S  # T x [B, HV, V] -> [B, HV, T, V]


def empty_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """No sequence, head or token (B, H or T = 0): o is empty [B, H, T, V], and the final state
    is the initial state (zeros without one), since no transition ran: S_T = S_0 for T = 0.

    Every form gives this, as PyTorch's own ops give empty results of the right shape. The sum of
    every (empty) input is an exact 0 that keeps them in the graph, so that each gets an empty
    gradient of its shape (not None), and the initial state its gradient dS_0 = dS_T.
    """
    B, _, T, K = k.shape
    HV, V = v.shape[1], v.shape[-1]
    link = sum(x.sum() for x in (q, k, v, beta, g) if x is not None)  # 0: all are empty
    if initial_state is None:
        S0 = q.new_zeros(B, HV, K, V, dtype=compute_dtype(q.dtype))
    else:
        S0 = initial_state
    return torch.zeros_like(v) + link, S0 + link


def run(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    *,
    scale: float | None,
    mode: str,
    chunk_size: int,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    rule: str | None = None,
    reads: int = 1,
    keep_dtype: bool = False,
) -> tuple[Tensor, Tensor]:
    """Validated public tensors in, (o [B, T, HV, V] in the compute dtype, final state in the
    compute dtype) out.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; beta: [B, T, HV] or None (or, for ``rule`` "dplr",
    [B, T, HV, 2K] = [a | b]); ``rule``: the rule where the op names it (``Mechanism.of``); g:
    None, [B, T, HV] or [B, T, HV, K]; initial_state: [N, HV, K, V] or None (N = B, or the
    number of packed sequences). HV = groups * H: grouped value heads, value head j reading q/k
    head j // groups in place (every form takes q, k with H heads: no copy of them).
    ``reads`` = R > 1 (the chunk form where ``library.reads_apply``, chunk_size a multiple of R,
    no cu_seqlens): q [B, T / R, H, K] read after the last of each R write rows, o
    [B, T / R, HV, V] (DeltaProduct's n_h writes per token).

    ``keep_dtype`` (for a caller that only converts o to the input dtype): the chunk form reads
    bfloat16 and float16 inputs in their dtype, converting them chunk by chunk inside the fused
    kernels (no whole-tensor float32 copy), and o comes back in v's dtype, rounded once from
    float32 as the conversion afterwards would round it.
    """
    bounds = None if cu_seqlens is None else cu_seqlens.tolist()
    if mode == "chunk":
        lengths = [k.shape[1]] if bounds is None else [e - s for s, e in itertools.pairwise(bounds)]
        check_chunk(chunk_size, lengths)
    # scale=None means 1/sqrt(K), as in the established library (the spec's plain form is 1.0).
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mech = Mechanism.of(beta, g, rule)  # the row of the table, resolved once (``mechanism``)
    keep_low = keep_dtype and mode == "chunk"

    def batch(q, k, v, beta, g, S0):  # one batch of equal-length sequences, public layout
        # [B, T, H, D] -> [B, H, T, D] views (no copy in the compute dtype); ``forward`` scales q.
        q, k, v, beta, g = to_internal(q, k, v, beta=beta, g=g, keep_low=keep_low)
        S0 = None if S0 is None else S0.to(compute_dtype(q.dtype))
        o, S = forward(mode, mech, q, k, v, beta, g, S0, chunk_size, scale, reads)
        return o.transpose(1, 2), S

    if cu_seqlens is None:
        return batch(q, k, v, beta, g, initial_state)
    # Packed sequences (B = 1): each from its own initial state, run as a few batches (``_packed``).
    return _packed.run(bounds, (q, k, v, beta, g), initial_state, batch)
