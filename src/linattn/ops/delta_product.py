"""Gated DeltaProduct: n_h delta-rule writes per token, one read (Siems et al. 2025).

Per token t, with alpha_t = exp(g_t) (no gate, one per head or one per key channel, as
``delta_rule``'s g):

    S <- alpha_t S
    S <- (I - beta_tj k_tj k_tj^T) S + beta_tj k_tj v_tj^T       for j = 1 .. n_h
    o_t = S^T (scale q_t)

The token's transition is alpha_t times a product of n_h generalized Householder matrices (rank
n_h instead of one; with beta in [0, 2] its eigenvalues reach -1). k, v and beta have T n_h rows
in fla's layout: the writes of token t are rows t n_h .. t n_h + n_h - 1.

Its own op rather than ``delta_rule(..., num_householder=n)``: its k, v and beta have n_h times
the rows of q and g, which every argument of ``delta_rule`` (and its checks, and its docstring's
shapes) would have to say twice; a separate op keeps ``delta_rule``'s contract (every input has T
rows) and reads as fla's ``chunk_gated_delta_product`` does.

It is exactly the delta rule (spec sections 7, 8) run on the T n_h interleaved rows, with the
gate at the first write of each token (log-decay 0 at the others) and the output read at the last
write; so every form (parallel, recurrent, chunk with the fused C++ loop), ``cu_seqlens``, the
states, grouped value heads and the gradients are the delta rule's own engine (``_engine.run``).
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops import _engine
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops.functional import l2norm
from linattn.ops.library import reads_apply
from linattn.ops.step import recurrent_step


def householder_count(num_householder: object) -> int:
    """n_h, the number of writes per token: an int >= 1 (named ``num_householder``)."""
    n = _checks.integer("num_householder", num_householder)
    if n < 1:
        raise ValueError(f"num_householder must be an int >= 1, got {n}")
    return n


def _check_writes(q, k, v, beta, g, n: int, cu_seqlens, initial_state) -> None:
    """The tensors of ``gated_delta_product``: shapes (T n_h rows of k, v, beta), dtypes and
    values, the packed sequences and the initial state, each error naming its argument."""
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v, writes=n)
    writes_shapes(k, v, beta, (B, T, H, HV, K, V), n)
    _checks.beta(beta, B, T * n, HV)
    _checks.gate(g, B, T, HV, K)
    N = _checks.seqlens(cu_seqlens, B, T)
    _checks.state(initial_state, N, HV, K, V)


def writes_shapes(k: object, v: object, beta: object, sizes: tuple[int, ...], n: int) -> None:
    """k [B, T n_h, H, K], v [B, T n_h, HV, V], beta [B, T n_h, HV] for q of ``sizes`` =
    (B, T, H, HV, K, V): each names itself and the row count it needs."""
    B, T, H, HV, K, V = sizes
    for name, x, shape in (
        ("k", k, (B, T * n, H, K)),
        ("v", v, (B, T * n, HV, V)),
        ("beta", beta, (B, T * n, HV)),
    ):
        if name == "beta":
            _checks.tensor(name, x, len(shape), finite=False)  # its range check rejects NaN
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{name} must have T * num_householder = {T} * {n} rows, shape {shape} (the "
                f"writes of token t are rows t * {n} .. t * {n} + {n - 1}), got {tuple(x.shape)}"
            )


def interleave_gate(g: Tensor | None, n: int) -> Tensor | None:
    """g [B, T, HV(, K)] -> [B, T n_h, HV(, K)]: g_t at the first write of token t, 0 (alpha = 1)
    at the others, so that the decay acts once per token, before its writes."""
    if g is None or n == 1:
        return g
    B, T = g.shape[:2]
    rows = g.new_zeros(B, T, n, *g.shape[2:])  # [B, T, n_h, HV(, K)]
    rows[:, :, 0] = g
    return rows.flatten(1, 2)  # [B, T n_h, HV(, K)]


def interleave_query(q: Tensor, n: int) -> Tensor:
    """q [B, T, H, K] -> [B, T n_h, H, K]: q_t on each of the n_h writes of token t, in one copy.

    Only the read at the last write is kept; the others are dropped, so that their outputs get a
    zero gradient and add exactly 0 to q_t's (any query would do there: repeating q_t costs one
    copy, where zeros with q_t at the last write would cost a fill and a copy).
    """
    if n == 1:
        return q
    B, T = q.shape[:2]
    # [B, T, H, K] -> [B, T, 1, H, K] -> (broadcast) [B, T, n, H, K] -> [B, T n, H, K]
    return q.unsqueeze(2).expand(B, T, n, *q.shape[2:]).reshape(B, T * n, *q.shape[2:])


def query_stride(q: Tensor, v: Tensor, n: int, mode: str, chunk_size: int, cu_seqlens) -> int:
    """The write rows per query row the chunk form takes: n_h where the fused C++ loop reads q's
    T rows in place (``library.reads_apply``: eager float32, bfloat16 or float16 on the CPU;
    chunk_size >= n_h; no cu_seqlens; no empty dimension), forming no output at the writes not
    read (csrc/kernels.h, ``reads``), over chunks of whole tokens (chunk_size rounded down to a
    multiple of n_h); else
    1: q repeated on each write row (``interleave_query``) and the outputs not read dropped
    afterwards. Equal either way, up to the rounding of the chunks' sums.
    """
    fits = mode == "chunk" and chunk_size >= n and cu_seqlens is None
    if n == 1 or not fits or q.numel() == 0 or v.shape[2] == 0:
        return 1
    return n if reads_apply(q, "delta") else 1


def gated_delta_product(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    num_householder: int = 2,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Gated DeltaProduct: S <- alpha_t S, then n_h delta-rule writes, then o_t = S^T (scale q_t).

    With n_h = 1 it is ``delta_rule`` (Gated DeltaNet with g per head, KDA with g per channel).
    Computed as the delta rule on the T n_h interleaved rows (the module docstring), whose chunk
    form solves the UT transform of section 8 over chunks of ``chunk_size`` rows (writes).

    Args:
        q: [B, T, H, K]. k: [B, T n_h, H, K]. v: [B, T n_h, HV, V], HV a multiple of H (grouped
            value heads: value head j reads q/k head j // (HV // H)).
        beta: [B, T n_h, HV] in [0, 2] (2: a reflection, eigenvalue -1).
        g: None, [B, T, HV] or [B, T, HV, K]: one log-decay per token (<= 0, -inf a reset).
        num_householder: n_h >= 1, the writes per token.
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel", "recurrent" or "chunk" (as ``delta_rule``).
        chunk_size: rows (writes) per chunk of the chunk form, any int >= 1; where the fused
            C++ loop reads q in place (on the CPU, ``query_stride``), rounded down to a
            multiple of n_h (whole tokens: 63 rows for 64 at n_h = 3).
        initial_state: [B, HV, K, V] or None (zeros); [N, HV, K, V] with cu_seqlens.
        output_final_state: return the state after the last token (else None).
        cu_seqlens: None or cumulative token counts [N + 1] (B = 1) of packed sequences, in
            tokens (rows of q): sequence n has writes cu_seqlens[n] n_h .. cu_seqlens[n+1] n_h.
        use_qk_l2norm: normalise q and k to unit length along K first.

    Returns:
        o: [B, T, HV, V] in v's dtype; final_state [N, HV, K, V] in float32 (float64 for
        float64 inputs), or None.
    """
    n = householder_count(num_householder)
    _check_writes(q, k, v, beta, g, n, cu_seqlens, initial_state)
    chunk_size = _checks.options(mode, chunk_size)
    _checks.scale(scale)
    output_final_state = _checks.flag("output_final_state", output_final_state)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("gated_delta_product", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    if _checks.flag("use_qk_l2norm", use_qk_l2norm):
        dtype = _engine.compute_dtype(q.dtype)
        q, k = l2norm(q.to(dtype)), l2norm(k.to(dtype))
    R = query_stride(q, v, n, mode, chunk_size, cu_seqlens)
    o, S = _engine.run(
        q if R > 1 else interleave_query(q, n), k, v, beta, interleave_gate(g, n), scale=scale,
        mode=mode, chunk_size=chunk_size - chunk_size % R, initial_state=initial_state,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens * n, reads=R, keep_dtype=True,
        rule="delta",
    )  # fmt: skip
    if R == 1:
        o = o[:, n - 1 :: n]  # [B, T n_h, HV, V] -> [B, T, HV, V]: the read after the last write
    return o.to(v.dtype), S if output_final_state else None


def delta_product_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
) -> Tensor:
    """One token of Gated DeltaProduct for generation: n_h writes, one read; the state in place.

    S <- alpha S (g), then S <- (I - beta_j k_j k_j^T) S + beta_j k_j v_j^T for j = 1 .. n_h,
    and o = S^T (scale q): n_h calls of ``recurrent_step`` (the fused C++ step for float32 on the
    CPU), the gate on the first, the read of the last returned.

    Args:
        state: [B, HV, K, V], float32 or float64 (as ``recurrent_step``).
        q: [B, H, K]. k: [B, n_h, H, K]; v: [B, n_h, HV, V]; beta: [B, n_h, HV] (fla's layout
            of one token: its n_h writes in order). g: None, [B, HV] or [B, HV, K].
        scale: multiplies q; None means 1 / sqrt(K).

    Returns:
        o: [B, HV, V] in v's dtype.
    """
    _checks.tensor("k", k, 4)
    _checks.tensor("v", v, 4)
    B, n = k.shape[:2]
    if n < 1 or v.shape[:2] != (B, n):
        raise ValueError(
            f"k [B, n_h, H, K] and v [B, n_h, HV, V] must hold n_h >= 1 writes each, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    HV = v.shape[2]
    # Every value checked before the first write changes the state.
    _checks.beta(beta, B, n, HV, layout="[B, n_h, HV]")
    _checks.gate(g, B, HV, k.shape[-1], layout="[B, H]")
    o = None
    for j in range(n):
        o = recurrent_step(
            state, q, k[:, j], v[:, j], beta[:, j], g if j == 0 else None, scale=scale
        )
    return o
