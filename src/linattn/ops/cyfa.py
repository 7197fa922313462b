"""CyclicFlowAttention (CyFA): two scalar-decay memories and a softmax readout between them.

The recurrence (``linattn.reference.cyfa``, fla 0.6.0's ``fla.ops.cyfa``) writes the same slot
vector ``w_t = beta_t a(lambda_t)`` (M slots) into a key memory and a value memory:

    H^k_t = alpha_t H^k_{t-1} + k~_t w_t^T        (K x M)
    H^v_t = alpha_t H^v_{t-1} + w_t v_t^T         (M x V)

Each is linear attention with one decay per head (spec section 10, Mamba-2's row of the
mechanism table): H^k with keys k~ and values w, H^v with keys w and values v. The read between
them is not linear: ``z_t = R(lambda_t) H^k_t^T (scale q~_t)``, ``p_t = softmax(E z_t)``,
``u_t = R(lambda_t)^T E^T p_t``, ``o_t = H^v_t^T u_t``. Since ``u_t`` depends only on the
token's own row of the first memory's output, CyFA is (docs/design.md, "The one memory"):

    1. z = linear_attention(q~, k~, w, g, scale)      (the key memory read: [B, T, H, M])
    2. u = readout(z, lambda)                         (token by token, no state)
    3. o = linear_attention(u, w, v, g, scale=1)      (the value memory read)

so every form of linear attention (parallel, recurrent, chunk) is a form of CyFA, with its
gradients, packed sequences and states. This is how fla's chunk kernel computes it too (a fused
readout, then a scalar-decay chunk pass with ``q = u``, ``k = w``).

On CPU tensors in the compute dtypes (float32, float64), eager, the token-by-token parts (the
norms' factors, the write and the readout, forward and backward) run in C++
(``csrc/cyfa.cpp``, ``_token_kernels``); traced, or on other devices, the PyTorch formulas below.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import _engine, _native, checks, tuning
from linattn.ops import backends as _backends
from linattn.ops.library import tracing

CyFAState = tuple[Tensor, Tensor, Tensor]


def num_slots_of(readout: object, H: int) -> int:
    """M = P + 1 for a readout [H, P, P]; M must be even (fla's ``num_slots``)."""
    checks.tensor("readout", readout, 3)
    if readout.shape[0] != H or readout.shape[1] != readout.shape[2]:
        raise ValueError(
            f"readout must have shape [H, P, P] with H = {H}, got {tuple(readout.shape)}"
        )
    M = readout.shape[-1] + 1
    if M % 2:
        raise ValueError(f"readout must be [H, P, P] with P + 1 (the slots) even, got P = {M - 1}")
    return M


def fourier_basis(num_slots: int, dtype: torch.dtype, device=None) -> Tensor:
    """The readout's P x M real Fourier basis (``linattn.reference.cyfa.fourier_basis``)."""
    P = num_slots - 1
    m = torch.arange(num_slots, device=device)
    omega = (m // 2).to(dtype) * (2 * math.pi / P)
    r = torch.arange(P, device=device, dtype=dtype)[:, None]
    basis = torch.where(m % 2 == 1, torch.sin(r * omega), torch.cos(r * omega))
    col = torch.full((num_slots,), (2.0 / P) ** 0.5, dtype=dtype, device=device)
    col[0], col[1] = P**-0.5, 0.0
    return basis * col


def phases(lam: Tensor, num_slots: int) -> tuple[Tensor, Tensor]:
    """cos and sin of ``omega_j lambda`` for the M / 2 slot pairs j: [..., M / 2] each.

    The angle is reduced in whole periods first, as fla's kernels do: with P = M - 1,
    ``j lambda mod P = (floor(lambda) mod P) j mod P + frac(lambda) j`` (integers for the whole
    part), then wrapped to (-P / 2, P / 2], so a long clock keeps float32's precision. The
    gradient flows through ``frac(lambda)`` (d angle / d lambda = omega_j).
    """
    P = num_slots - 1
    j = torch.arange(num_slots // 2, device=lam.device)
    whole = torch.floor(lam.detach())
    frac = lam - whole
    coordinate = (whole.long().remainder(P).unsqueeze(-1) * j).remainder(P).to(lam.dtype)
    coordinate = coordinate + frac.unsqueeze(-1) * j.to(lam.dtype)
    coordinate = torch.where(coordinate > P / 2, coordinate - P, coordinate)
    angle = coordinate * (2 * math.pi / P)
    return torch.cos(angle), torch.sin(angle)


def write_direction(
    lam: Tensor, beta: Tensor, num_slots: int, cos_sin: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """w = beta a(lambda): [..., M], a's even slots ``c cos``, odd ones ``-c sin``
    (``cos_sin``: ``phases(lam, M)``, where the caller has them)."""
    P = num_slots - 1
    c, s = phases(lam, num_slots) if cos_sin is None else cos_sin
    pair_scale = torch.full_like(c[..., :1], (2.0 / P) ** 0.5).expand_as(c).clone()
    pair_scale[..., 0] = P**-0.5
    atom = torch.stack((c * pair_scale, -s * pair_scale), dim=-1).flatten(-2)
    return beta.unsqueeze(-1) * atom


def _rotate(x: Tensor, c: Tensor, s: Tensor, sign: float) -> Tensor:
    """R(lambda) x (sign 1) or R(lambda)^T x (sign -1) on the slot pairs of x [..., M]."""
    xc, xs = x[..., 0::2], x[..., 1::2]
    s = sign * s
    return torch.stack((c * xc - s * xs, s * xc + c * xs), dim=-1).flatten(-2)


def readout_weights(
    z: Tensor, lam: Tensor, table: Tensor, cos_sin: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """u = R^T E^T softmax(E R z) per token: z [B, T, H, M], lam [B, T, H], table E [H, P, M]
    (``cos_sin``: ``phases(lam, M)``, where the caller has them)."""
    M = z.shape[-1]
    c, s = phases(lam, M) if cos_sin is None else cos_sin
    logits = torch.einsum("hrm,bthm->bthr", table, _rotate(z, c, s, 1.0))
    probs = torch.softmax(logits, dim=-1)
    return _rotate(torch.einsum("hrm,bthr->bthm", table, probs), c, s, -1.0)


def _slot_rows(lam: Tensor, num_slots: int) -> tuple[Tensor, Tensor]:
    """``phases`` as rows: cos and sin [B, H, M / 2, T] for lambda [B, T, H] (the layout of
    ``_write_and_readout``, where every operation runs along the tokens)."""
    # phases' steps, each on [B, H, M / 2, T] at once (no transposed copies afterwards)
    P = num_slots - 1
    j = torch.arange(num_slots // 2, device=lam.device)[:, None]
    lam = lam.transpose(1, 2).contiguous().unsqueeze(-2)  # [B, H, 1, T]
    whole = torch.floor(lam.detach())
    frac = lam - whole
    coordinate = (whole.long().remainder(P) * j).remainder(P).to(lam.dtype)
    coordinate = coordinate + frac * j.to(lam.dtype)
    coordinate = torch.where(coordinate > P / 2, coordinate - P, coordinate)
    angle = coordinate * (2 * math.pi / P)
    return torch.cos(angle), torch.sin(angle)


def _rotate_rows(x: Tensor, c: Tensor, s: Tensor, sign: float) -> Tensor:
    """``_rotate`` on slot rows: x [B, H, M, T], c and s [B, H, M / 2, T]."""
    x0, x1 = x[..., 0::2, :], x[..., 1::2, :]
    s = s if sign > 0 else -s
    return torch.stack((c * x0 - s * x1, s * x0 + c * x1), dim=-2).flatten(-3, -2)


def _write_rows(c: Tensor, s: Tensor, beta: Tensor) -> Tensor:
    """``write_direction`` on slot rows: w [B, H, M, T] for beta [B, T, H]."""
    P = 2 * c.shape[-2] - 1
    pair_scale = torch.full((c.shape[-2], 1), (2.0 / P) ** 0.5, dtype=c.dtype, device=c.device)
    pair_scale[0] = P**-0.5
    atom = torch.stack((c * pair_scale, -s * pair_scale), dim=-2).flatten(-3, -2)
    return atom * beta.transpose(1, 2).unsqueeze(-2)


def _readout_rows(z: Tensor, c: Tensor, s: Tensor, table: Tensor) -> Tensor:
    """``readout_weights`` on slot rows: z [B, H, M, T], table E [H, P, M]; the softmax over
    the P readout rows runs along the tokens (a softmax over a last dimension of P = 5 numbers is
    many times slower)."""
    logits = table @ _rotate_rows(z, c, s, 1.0)  # [B, H, P, T]
    probs = torch.softmax(logits, dim=-2)
    return _rotate_rows(table.transpose(-1, -2) @ probs, c, s, -1.0)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


class _NormParts(torch.autograd.Function):
    """The two factors of ``rms_norm``: (x * weight, r = 1 / sqrt(mean(x^2) + eps)), so that a
    caller multiplies r in where it is one number a token (the memories' reads and writes are
    linear in q~ and k~), not into a whole copy of x. Backward: dx = dy weight - (dr r^3 / K) x,
    dweight = sum dy x; the [..., K] tensors on the extension's cached pages. Where
    ``_token_kernels`` holds, both ways are one pass each in ``csrc/cyfa.cpp``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float):
        ctx.kernels = _token_kernels(x)
        if ctx.kernels:  # one pass over x (``csrc/cyfa.cpp``)
            y, r = _native.kernel("cyfa_norm")(x, weight, eps)
            ctx.save_for_backward(x, weight, r)
            return y, r
        K = x.shape[-1]
        r = torch.linalg.vector_norm(x, dim=-1).square_().div_(K).add_(eps).rsqrt_()
        y = _native.empty(tuple(x.shape), x)
        torch.mul(x, weight, out=y)
        ctx.save_for_backward(x, weight, r)
        return y, r

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor | None, dr: Tensor | None):
        x, weight, r = ctx.saved_tensors
        if ctx.kernels:  # dx and dweight in one pass over x and dy
            dx, dweight = _native.kernel("cyfa_norm_backward")(x, weight, r, dy, dr)
            return dx, (dweight if ctx.needs_input_grad[1] else None), None
        dx = _native.empty(tuple(x.shape), x)
        if dy is None:
            dx.zero_()
        else:
            torch.mul(dy, weight, out=dx)
        if dr is not None:
            dx.addcmul_(x, (dr * r.pow(3)).div_(-x.shape[-1]).unsqueeze(-1))
        dweight = None
        if ctx.needs_input_grad[1] and dy is not None:
            scratch = _native.empty(tuple(x.shape), x)
            dweight = torch.mul(dy, x, out=scratch).flatten(0, -2).sum(0)
        return dx, dweight, None


class _NormScale(torch.autograd.Function):
    """``_NormParts`` without the weight: (x itself, r = 1 / sqrt(mean(x^2) + eps)), x handed on
    as it is (a view, no copy); backward dx = dy - (dr r^3 / K) x in one pass (``csrc/cyfa.cpp``,
    the norm's backward with a weight of ones)."""

    @staticmethod
    def forward(ctx, x: Tensor, eps: float):
        r = torch.linalg.vector_norm(x, dim=-1).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, r)
        return x, r

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: Tensor | None, dr: Tensor | None):
        x, r = ctx.saved_tensors
        ones = x.new_ones(x.shape[-1])
        dx, _ = _native.kernel("cyfa_norm_backward")(x, ones, r, dy, dr)
        return dx, None


# The smallest |w_q| that ``cyfa`` folds into the keys (and divides the key memory's final state
# by): far above float32's normal range, so that w_q H^k and its quotient keep every digit.
FOLD_MIN_WEIGHT = 2.0**-40


def _foldable(wq: Tensor) -> bool:
    """Whether every query-norm weight is at least ``FOLD_MIN_WEIGHT`` in magnitude."""
    return bool(wq.abs().min() >= FOLD_MIN_WEIGHT) if wq.numel() else False


def clock(delta: Tensor, lambda0: Tensor | None, cu_seqlens: Tensor | None) -> Tensor:
    """lambda_t = lambda_0 + delta_1 + ... + delta_t, per sequence: [B, T, H]."""
    if cu_seqlens is None:
        lam = delta.cumsum(1)
        return lam if lambda0 is None else lam + lambda0[:, None]
    bounds = cu_seqlens.tolist()
    pieces = []
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        piece = delta[:, a:b].cumsum(1)
        pieces.append(piece if lambda0 is None else piece + lambda0[n][None, None])
    return torch.cat(pieces, dim=1)


def _check_state(initial_state: object, N: int, H: int, K: int, M: int, V: int) -> None:
    if initial_state is None:
        return
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 3:
        raise ValueError("initial_state must be None or a tuple (H^k, H^v, lambda)")
    Hk, Hv, lam = initial_state
    for name, x, shape in (
        ("initial_state[0] (the key memory)", Hk, (N, H, K, M)),
        ("initial_state[1] (the value memory)", Hv, (N, H, M, V)),
        ("initial_state[2] (the clock lambda)", lam, (N, H)),
    ):
        checks.tensor(name, x, len(shape))
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")


def cyfa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    delta: Tensor,
    beta: Tensor,
    readout: Tensor,
    q_norm_weight: Tensor,
    k_norm_weight: Tensor,
    *,
    q_norm_eps: float = 1e-5,
    k_norm_eps: float = 1e-5,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: CyFAState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, CyFAState | None]:
    """CyclicFlowAttention: ``o_t = H^v_t^T R_t^T E^T softmax(E R_t H^k_t^T (scale q~_t))``.

    The two memories, the clock and the readout are the module docstring's (and
    ``linattn.reference.cyfa``'s, the float64 oracle); both memories are spec section 10's
    scalar-decay linear attention, run in ``mode`` by ``linear_attention``.

    Args:
        q, k: [B, T, H, K] (RMS-normalised here with q_norm_weight / k_norm_weight [K]).
        v: [B, T, H, V]. g: [B, T, H] log-decays (<= 0). delta: [B, T, H] clock steps.
        beta: [B, T, H] write strengths. readout: [H, P, P], M = P + 1 slots (M even).
        q_norm_eps, k_norm_eps: the RMS norms' epsilons. scale: None is 1 / sqrt(K).
        mode: "parallel", "recurrent" or "chunk" (of both memories). chunk_size: >= 1.
        initial_state: None or (H^k [N, H, K, M], H^v [N, H, M, V], lambda [N, H]).
        cu_seqlens: packed sequences (B = 1), N of them.

    Returns:
        (o [B, T, H, V] in q's dtype, (H^k, H^v, lambda) in the compute dtype or None).
    """
    B, T, H, K, V = checks.qkv(q, k, v)
    for name, x in (("g", g), ("delta", delta), ("beta", beta)):
        checks.tensor(name, x, 3)
        if tuple(x.shape) != (B, T, H):
            raise ValueError(
                f"{name} must have shape [B, T, H] = {(B, T, H)}, got {tuple(x.shape)}"
            )
    if checks.value_range("g", g)[1] > 0:
        raise ValueError("g must be <= 0 (a log-decay, alpha = exp g <= 1)")
    M = num_slots_of(readout, H)
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        checks.tensor(name, w, 1)
        if w.shape[0] != K:
            raise ValueError(f"{name} must have shape [K] = [{K}], got {tuple(w.shape)}")
    checks.scale(scale)
    chunk_size = checks.options(mode, chunk_size)
    output_final_state = checks.flag("output_final_state", output_final_state)
    N = checks.seqlens(cu_seqlens, B, T)
    _check_state(initial_state, N, H, K, M, V)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("cyfa", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)

    dtype, q_dtype = compute_dtype(q.dtype), q.dtype
    q, k, v, g, delta, beta, readout, wq, wk = (
        x.to(dtype) for x in (q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight)
    )
    Hk0, Hv0, lam0 = (None, None, None) if initial_state is None else (
        x.to(dtype) for x in initial_state
    )  # fmt: skip
    scale = K**-0.5 if scale is None else float(scale)
    # q~ = r_q (q * w_q), k~ = r_k (k * w_k) with r one number a token: r_k goes into the
    # write w (the key memory's values), r_q onto its read z, so no normalised copy is made.
    kernels = _token_kernels(q)
    folded = kernels and _foldable(wq)
    if folded:
        # w_q moved onto the keys: q~ . k~ = r_q r_k q . (w_q w_k k), and the key memory then
        # holds diag(w_q) H^k (its initial state scaled so, its final one scaled back), so that
        # q is read in place, not copied (``_foldable``: every w_q far from zero).
        qw, r_q = _NormScale.apply(q, float(q_norm_eps))
        kw, r_k = _NormParts.apply(k, wq * wk, float(k_norm_eps))
        Hk0 = None if Hk0 is None else Hk0 * wq[:, None]
    else:
        qw, r_q = _NormParts.apply(q, wq, float(q_norm_eps))
        kw, r_k = _NormParts.apply(k, wk, float(k_norm_eps))
    lam = clock(delta, lam0, cu_seqlens)
    table = readout @ fourier_basis(M, dtype, q.device)
    common = dict(mode=mode, chunk_size=chunk_size, cu_seqlens=cu_seqlens)
    # The key memory's values w r_k, padded with zero slots to the fused chunk form's narrowest
    # fast width (``tuning.NARROW_VALUES``): the padded slots stay zero in its state and read as
    # zeros, so z and H^k are its first M slots.
    width = max(M, tuning.NARROW_VALUES) if mode == "chunk" else M
    if Hk0 is not None and width > M:
        Hk0 = torch.nn.functional.pad(Hk0, (0, width - M))
    if kernels:
        # The write and the readout in C++ (``csrc/cyfa.cpp``), on contiguous [B, H, T, .]
        # rows: the memories read them in place, as the transposed views they are handed.
        keys, values = _Write.apply(lam, beta, r_k, M, width)
        z, Hk = _memory(qw, kw, values.transpose(1, 2), g, scale, Hk0, **common)
        u = _Readout.apply(z.transpose(1, 2), r_q, lam, table).transpose(1, 2)
        o, Hv = _memory(u, keys.transpose(1, 2), v, g, 1.0, Hv0, **common)
    else:
        # The write and the readout token by token on slot rows [B, H, M, T]
        # (``_slot_rows``), handed to the memories as [B, T, H, M] views.
        c, s = _slot_rows(lam, M)
        w = _write_rows(c, s, beta).permute(0, 3, 1, 2)
        values = _native.empty((B, T, H, width), w)
        values[..., M:] = 0
        values[..., :M] = w * r_k[..., None]
        z, Hk = _memory(qw, kw, values, g, scale, Hk0, **common)
        z = (z[..., :M] * r_q[..., None]).permute(0, 2, 3, 1)  # [B, H, M, T]
        u = _readout_rows(z, c, s, table).permute(0, 3, 1, 2)
        o, Hv = _memory(u, w, v, g, 1.0, Hv0, **common)
    if width > M:
        Hk = Hk[..., :M]
    Hk = Hk / wq[:, None] if folded else Hk.contiguous()
    o = o.to(q_dtype)
    if not output_final_state:
        return o, None
    lam_final = _segment_sum(delta, cu_seqlens)
    if lam0 is not None:
        lam_final = lam_final + lam0
    return o, (Hk, Hv, lam_final)


def _token_kernels(x: Tensor) -> bool:
    """Whether ``csrc/cyfa.cpp`` serves the write and the readout: CPU tensors in float32 or
    float64 (the compute dtypes), the extension loaded, eager (a trace records the PyTorch ops)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and _native.available()
        and not tracing(x)
    )


class _Write(torch.autograd.Function):
    """``write_direction`` on the kernels: lam, beta, r_k [B, T, H] -> (w [B, H, T, M], the key
    memory's values w r_k zero-padded to [B, H, T, width]), contiguous; backward (dlam, dbeta,
    dr_k) from both outputs' gradients (``csrc/cyfa.cpp`` states the formulas)."""

    @staticmethod
    def forward(ctx, lam: Tensor, beta: Tensor, r_k: Tensor, slots: int, width: int):
        ctx.save_for_backward(lam, beta, r_k)
        ctx.widths = (slots, width)
        return _native.kernel("cyfa_write")(lam, beta, r_k, slots, width)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dkeys: Tensor | None, dvalues: Tensor | None):
        lam, beta, r_k = ctx.saved_tensors
        B, T, H = lam.shape
        if dkeys is None:  # an output that reached no loss: a zero gradient
            dkeys = lam.new_zeros(B, H, T, ctx.widths[0])
        if dvalues is None:
            dvalues = lam.new_zeros(B, H, T, ctx.widths[1])
        dlam, dbeta, dr_k = _native.kernel("cyfa_write_backward")(lam, beta, r_k, dkeys, dvalues)
        return dlam, dbeta, dr_k, None, None


class _Readout(torch.autograd.Function):
    """``readout_weights`` on the kernels: z [B, H, T, W] (the key memory's read, its first M
    slots used), r_q, lam [B, T, H], table [H, P, M] -> u [B, H, T, M], contiguous (the product
    r_q z made inside); backward (dz, dr_q, dlam, dtable), ``csrc/cyfa.cpp``'s formulas."""

    @staticmethod
    def forward(ctx, z: Tensor, r_q: Tensor, lam: Tensor, table: Tensor):
        ctx.save_for_backward(z, r_q, lam, table)
        return _native.kernel("cyfa_readout")(z, r_q, lam, table)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, du: Tensor):
        z, r_q, lam, table = ctx.saved_tensors
        return _native.kernel("cyfa_readout_backward")(z, r_q, lam, table, du)


def _memory(q, k, v, g, scale, initial_state, *, mode, chunk_size, cu_seqlens):
    """One of the two memories: ``linear_attention``'s scalar-decay form on tensors that ``cyfa``
    has checked or made from checked ones (its checks, passes over every input, would repeat
    them): (o [B, T, H, V], final state), both in the compute dtype."""
    return _engine.run(q, k, v, None, g, scale=scale, mode=mode, chunk_size=chunk_size,
                       initial_state=initial_state, cu_seqlens=cu_seqlens, rule="additive",
                       keep_dtype=True)  # fmt: skip


def _segment_sum(delta: Tensor, cu_seqlens: Tensor | None) -> Tensor:
    """The clock's total advance per sequence: [N, H]."""
    if cu_seqlens is None:
        return delta.sum(1)
    bounds = cu_seqlens.tolist()
    return torch.stack([delta[0, a:b].sum(0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
