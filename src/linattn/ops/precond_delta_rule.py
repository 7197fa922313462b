"""The preconditioned delta rule: Preconditioned Gated DeltaNet and Preconditioned KDA.

Preconditioned DeltaNet (arXiv:2604.21100; fla 0.6.0's ``fla.ops.precond_gated_delta_rule`` and
``fla.ops.precond_kda``) keeps a second state next to the memory S: a diagonal curvature
estimate A_t [K] per key head (fla's "ATK" state), and writes the memory along a preconditioned
key:

    A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2                  (per key channel)
    r_t = log(A_t + eps) - c,   s_t = r_t / (1 + |r_t|),   M_t = x^(-s_t)   (in [1/x, x])
    kp_t = M_t * k_t
    S_t = D_t S_{t-1} + beta_t kp_t (v_t - (D_t S_{t-1})^T k_t)^T,   o_t = S_t^T (scale q_t)

with D_t = exp(g_t) I (Gated DeltaNet's gate, [B, T, HV]) or Diag(exp g_t) (KDA's, [B, T, HV,
K]), c the per-head centre ``log_atk_scale`` (-0.2 by default) and x the squash range (1.5).

The second state depends on the keys and its own gates only, never on S or v: it is a diagonal
linear recurrence over the inputs, computed here first (``atk_preconditioner``: its recurrent
form, a token loop, and its chunk form, one masked C x C decay matrix per chunk), and the
memory is then the oblique delta rule (``linattn.ops.rules.oblique``: the delta rule whose read
key differs from its write key),

    S_t = D_t S_{t-1} + w_t (v_t - (D_t S_{t-1})^T k_t)^T,   write key w_t = beta_t kp_t,
    read key k_t,

whose parallel, recurrent and chunk forms (the delta rule's UT transform, and its fused kernel),
packed sequences, states and gradients serve the memory unchanged. The decoding step writes the
same transition as the generalized delta rule's (``recurrent_step`` with a = -beta kp,
b = exp(g) * k: I - beta kp k^T after the decay). So the mechanism is an existing rule with
inputs transformed by a second, input-only state; the op returns both final states (fla's
layout: S [N, HV, K, V], A [N, H, K]).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from linattn.ops import _engine, _native
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops.functional import l2norm
from linattn.ops.step import recurrent_step

X = 1.5  # fla's squash range
EPS = 1e-6  # fla's epsilon inside the log
CENTER = -0.2  # fla's default log_atk_scale
ATK_CHUNK = 64  # the preconditioner's chunk (fla's)
CHUNK_SIZE = 64  # the memory's default chunk (the oblique rule's, as the delta rule's)


def _positive_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def check_atk(
    k: Tensor,
    g_atk: object,
    beta_atk: object,
    x: object,
    eps: object,
    log_atk_scale: object,
    initial_A_state: object,
    N: int,
) -> None:
    """The preconditioner's own arguments (k [B, T, H, K] checked already): g_atk [B, T, H] a
    finite log-decay (<= 0), beta_atk [B, T, H] finite and >= 0, x and eps > 0, log_atk_scale
    None, a real or a finite [H] tensor, initial_A_state None or [N, H, K] finite and >= 0 (A
    enters a log: a negative A would make it NaN)."""
    B, T, H, K = k.shape
    for name, t in (("g_atk", g_atk), ("beta_atk", beta_atk)):
        _checks.tensor(name, t, 3)
        if tuple(t.shape) != (B, T, H):
            raise ValueError(
                f"{name} must have shape [B, T, H] = {(B, T, H)}, got {tuple(t.shape)}"
            )
    if g_atk.numel() and float(g_atk.detach().max()) > 0:
        raise ValueError(f"g_atk is a log-decay and must be <= 0; got max {float(g_atk.max())}")
    if beta_atk.numel() and float(beta_atk.detach().min()) < 0:
        raise ValueError(f"beta_atk must be >= 0; got min {float(beta_atk.min())}")
    _positive_real("x", x)
    _positive_real("eps", eps)
    if isinstance(log_atk_scale, Tensor):
        _checks.tensor("log_atk_scale", log_atk_scale, 1)
        if tuple(log_atk_scale.shape) != (H,):
            raise ValueError(
                f"log_atk_scale must have shape [H] = {(H,)}, got {tuple(log_atk_scale.shape)}"
            )
    elif log_atk_scale is not None:
        if isinstance(log_atk_scale, bool) or not isinstance(log_atk_scale, (int, float)):
            raise TypeError(
                f"log_atk_scale must be None, a float or a [H] tensor, got "
                f"{type(log_atk_scale).__name__}"
            )
        if not math.isfinite(log_atk_scale):
            raise ValueError(f"log_atk_scale must be finite, got {log_atk_scale}")
    if initial_A_state is not None:
        _checks.tensor("initial_A_state", initial_A_state, 3)
        if tuple(initial_A_state.shape) != (N, H, K):
            raise ValueError(
                f"initial_A_state must have shape [N, H, K] = {(N, H, K)} (N = batch size or "
                f"number of sequences in cu_seqlens), got {tuple(initial_A_state.shape)}"
            )
        if initial_A_state.numel() and float(initial_A_state.detach().min()) < 0:
            raise ValueError("initial_A_state must be >= 0 (A enters log(A + eps))")


def squash(A: Tensor, center: Tensor, x: float, eps: float) -> Tensor:
    """M = x^(-s), s = r / (1 + |r|), r = log(A + eps) - center: the multiplier in [1/x, x]."""
    r = torch.log(A + eps) - center
    return torch.exp(-math.log(x) * (r / (1.0 + r.abs())))


def _center(log_atk_scale, H: int, dtype: torch.dtype, device) -> Tensor:
    """The centre c per head as [H, 1] (broadcast over K)."""
    if log_atk_scale is None:
        log_atk_scale = CENTER
    if isinstance(log_atk_scale, Tensor):
        return log_atk_scale.to(dtype).reshape(H, 1)
    return torch.full((H, 1), float(log_atk_scale), dtype=dtype, device=device)


def _atk_recurrent(k2b, g, A):
    """A_t = exp(g_t) A_{t-1} + beta_t k_t^2 token by token; k2b [B, T, H, K] = beta k^2,
    g [B, T, H]; returns (A_t for every t [B, T, H, K], A_T)."""
    out = []
    for t in range(k2b.shape[1]):
        A = torch.exp(g[:, t]).unsqueeze(-1) * A + k2b[:, t]
        out.append(A)
    return (torch.stack(out, 1) if out else k2b), A


def _atk_chunk(k2b, g, A, C: int):
    """The same scan chunk by chunk: within a chunk, with G_t the cumulative log-gate,
    A_t = exp(G_t) A_0 + sum_{s <= t} exp(G_t - G_s) beta_s k_s^2 (one masked C x C matrix,
    every exponent <= 0)."""
    out = []
    for s in range(0, k2b.shape[1], C):
        gc = g[:, s : s + C]  # [B, c, H]
        G = gc.cumsum(1)
        c = gc.shape[1]
        causal = torch.ones(c, c, dtype=torch.bool, device=g.device).tril()
        diff = (G.unsqueeze(2) - G.unsqueeze(1)).masked_fill(~causal[None, :, :, None], -math.inf)
        L = torch.exp(diff)  # [B, t, s, H]
        chunk = torch.einsum("btsh,bshk->bthk", L, k2b[:, s : s + C])
        chunk = chunk + torch.exp(G).unsqueeze(-1) * A.unsqueeze(1)
        out.append(chunk)
        A = chunk[:, -1]
    return (torch.cat(out, 1) if out else k2b), A


def atk_preconditioner(
    k: Tensor,
    g_atk: Tensor,
    beta_atk: Tensor,
    *,
    x: float = X,
    eps: float = EPS,
    log_atk_scale: Tensor | float | None = None,
    initial_A_state: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    mode: str = "chunk",
    chunk_size: int = ATK_CHUNK,
) -> tuple[Tensor, Tensor]:
    """The preconditioned keys kp_t = M_t * k_t and the final ATK state (module docstring).

    A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2, M_t = x^(-s_t), s_t = r_t / (1 + |r_t|),
    r_t = log(A_t + eps) - log_atk_scale (arXiv:2604.21100). mode "recurrent": the token loop;
    "chunk" (and "parallel", one chunk of T): the chunked scan, or for float32 CPU tensors in
    mode "chunk" the scan and the squash fused in one pass (csrc/atk.cpp; the fused kernels'
    own log and exp, a few ulp). Arguments unchecked (the ops
    check them): k [B, T, H, K], g_atk and beta_atk [B, T, H], initial_A_state None or
    [N, H, K]. Computed in k's compute dtype; returns (kp [B, T, H, K], A [N, H, K]).
    """
    dtype = _engine.compute_dtype(k.dtype)
    B, T, H, K = k.shape
    kc = k.to(dtype)
    g = g_atk.to(dtype)
    center = _center(log_atk_scale, H, dtype, k.device)
    bounds = [0, T] if cu_seqlens is None else cu_seqlens.tolist()
    N = B if cu_seqlens is None else len(bounds) - 1
    A0 = k.new_zeros((N, H, K), dtype=dtype)
    if initial_A_state is not None:
        A0 = initial_A_state.to(dtype)
    if mode == "chunk" and _native.applies(kc) and T > 0:
        # float32 on the CPU: the scan and the squash in one pass (csrc/atk.cpp)
        args = (kc, g, beta_atk.to(dtype), A0, center.reshape(H), math.log(x), float(eps))
        if cu_seqlens is None:
            return _FusedAtk.apply(*args)
        parts = [
            _FusedAtk.apply(kc[:, s:e], g[:, s:e], args[2][:, s:e], A0[n : n + 1], *args[4:])
            for n, (s, e) in enumerate(itertools.pairwise(bounds))
        ]
        return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 0)
    k2b = beta_atk.to(dtype).unsqueeze(-1) * kc.square()
    scan = _atk_recurrent if mode == "recurrent" else _atk_chunk
    extra = () if mode == "recurrent" else (max(T, 1) if mode == "parallel" else chunk_size,)
    if cu_seqlens is None:
        A_all, A_final = scan(k2b, g, A0, *extra)
    else:
        parts, finals = [], []
        for n in range(N):
            s, e = bounds[n], bounds[n + 1]
            A_n, final = scan(k2b[:, s:e], g[:, s:e], A0[n : n + 1], *extra)
            parts.append(A_n)
            finals.append(final)
        A_all, A_final = torch.cat(parts, 1), torch.cat(finals, 0)
    return kc * squash(A_all, center, x, eps), A_final


class _FusedAtk(torch.autograd.Function):
    """``atk_preconditioner``'s chunk form on float32 CPU tensors: the scan and the squash in one
    C++ pass (csrc/atk.cpp), forward and backward; (kp [B, T, H, K], A_T [N, H, K])."""

    @staticmethod
    def forward(ctx, k, g, beta, A0, center, log_x, eps):
        keep = any(ctx.needs_input_grad[:5])
        inputs = [t.contiguous() for t in (k, g, beta, A0, center)]
        kp, A_end, A_all = _native.fused("atk_forward")(*inputs, log_x, eps, keep)
        if keep:
            ctx.save_for_backward(*inputs, A_all)
        ctx.log_x, ctx.eps = log_x, eps
        return kp, A_end

    @staticmethod
    def backward(ctx, dkp, dA_end):
        k, g, beta, A0, center, A_all = ctx.saved_tensors
        dkp = torch.zeros_like(k) if dkp is None else dkp.contiguous()
        dA_end = torch.zeros_like(A0) if dA_end is None else dA_end.contiguous()
        args = (k, g, beta, A0, center, A_all, dkp, dA_end, ctx.log_x, ctx.eps)
        dk, dg, dbeta, dA0, dcenter = _native.fused("atk_backward")(*args)
        return dk, dg, dbeta, dA0, dcenter, None, None


class _FusedAtkWrite(torch.autograd.Function):
    """The memory's write keys w = beta kp (per value head) on float32 CPU tensors: the scan, the
    squash and the product by beta in one C++ pass (csrc/atk.cpp, ``atk_write_forward``), forward
    and backward; (w [B, T, HV, K], A_T [N, H, K], k). k comes back as it went in, for the
    memory's read key: its gradient there then reaches this backward, which adds it into dk in
    its own pass (no separate sum of k's two gradients)."""

    @staticmethod
    def forward(ctx, k, g, beta_atk, A0, center, beta, log_x, eps):
        keep = any(ctx.needs_input_grad[:6])
        inputs = [t.contiguous() for t in (k, g, beta_atk, A0, center, beta)]
        w, A_end, A_all = _native.fused("atk_write_forward")(*inputs, log_x, eps, keep)
        if keep:
            ctx.save_for_backward(*inputs, A_all)
        ctx.log_x, ctx.eps = log_x, eps
        return w, A_end, k

    @staticmethod
    def backward(ctx, dw, dA_end, dr):
        k, g, beta_atk, A0, center, beta, A_all = ctx.saved_tensors
        B, T, H, K = k.shape
        dw = k.new_zeros((B, T, beta.shape[2], K)) if dw is None else dw.contiguous()
        dA_end = torch.zeros_like(A0) if dA_end is None else dA_end.contiguous()
        dr = None if dr is None else dr.contiguous()
        args = (k, g, beta_atk, A0, center, beta, A_all, dw, dA_end, dr, ctx.log_x, ctx.eps)
        return (*_native.fused("atk_write_backward")(*args), None, None)


def _fused_write_keys(k, g_atk, beta_atk, beta, *, x, eps, log_atk_scale, initial_A_state,
                      cu_seqlens):  # fmt: skip
    """The write keys beta kp [B, T, HV, K], A_T [N, H, K] and the read key k (``_FusedAtkWrite``'s
    alias of it, or k itself for packed sequences) by ``_FusedAtkWrite`` (float32 CPU k, the
    chunk form), sequence by sequence for packed ones: ``atk_preconditioner``'s kp and its
    product by beta, each rounded as there."""
    B, T, H, K = k.shape
    center = _center(log_atk_scale, H, k.dtype, k.device).reshape(H)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    A0 = k.new_zeros((N, H, K)) if initial_A_state is None else initial_A_state.to(k.dtype)
    rest = (center, beta.to(k.dtype), math.log(x), float(eps))
    g, b = g_atk.to(k.dtype), beta_atk.to(k.dtype)
    if cu_seqlens is None:
        return _FusedAtkWrite.apply(k, g, b, A0, *rest)  # (w, A, k)
    parts = [
        _FusedAtkWrite.apply(
            k[:, s:e], g[:, s:e], b[:, s:e], A0[n : n + 1], center, rest[1][:, s:e], *rest[2:]
        )
        for n, (s, e) in enumerate(itertools.pairwise(cu_seqlens.tolist()))
    ]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 0), k


def _per_value_head(t: Tensor, HV: int) -> Tensor:
    H = t.shape[2]
    return t if H in (0, HV) else t.repeat_interleave(HV // H, dim=2)


def precond_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g_atk: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    x: float = X,
    eps: float = EPS,
    log_atk_scale: Tensor | float | None = None,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = CHUNK_SIZE,
    initial_state: Tensor | None = None,
    initial_A_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The preconditioned (gated) delta rule of Preconditioned DeltaNet (arXiv:2604.21100):

        A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2,   kp_t = x^(-s(A_t)) * k_t
        S_t = D_t S_{t-1} + beta_t kp_t (v_t - (D_t S_{t-1})^T k_t)^T,   o_t = S_t^T (scale q_t)

    (the module docstring: s, D_t). The decay comes first and the correction reads the decayed
    state, as fla's kernels and naive loops compute it. g None: no decay (D = I); [B, T, HV]:
    Preconditioned Gated DeltaNet; [B, T, HV, K]: Preconditioned KDA. The memory runs as
    the oblique delta rule (``linattn.ops.rules.oblique``: write key beta kp, read key k, values
    v) after the preconditioner's scan (``atk_preconditioner``), in the same form (spec sections
    8, 10).

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H (grouped value heads share
            their key head's preconditioner).
        g_atk: [B, T, H], a finite log-decay (<= 0). beta_atk: [B, T, H], >= 0.
        beta: [B, T, HV], finite. g: None, [B, T, HV] or [B, T, HV, K], a log-decay (<= 0).
        x: the squash range (> 0), eps (> 0), log_atk_scale: the centre c (None: -0.2; a float
            or a per-head [H] tensor, differentiable).
        scale, mode, chunk_size, initial_state, output_final_state, cu_seqlens: as
            ``delta_rule``'s (chunk_size 64 by default).
        initial_A_state: None (zeros) or [N, H, K], >= 0.
        use_qk_l2norm: normalise q and k first, x / sqrt(|x|^2 + 1e-6) (default True, as fla's
            entry points: the preconditioner reads k^2, so the family is defined on unit keys).

    Returns:
        (o [B, T, HV, V] in v's dtype, S [N, HV, K, V] or None, A [N, H, K] or None), states in
        float32 (float64 for float64 inputs).
    """

    def own(B: int, T: int, HV: int, K: int, V: int) -> None:
        _checks.tensor("beta", beta, 3)
        if tuple(beta.shape) != (B, T, HV):
            raise ValueError(
                f"beta must have shape [B, T, HV] = {(B, T, HV)}, got {tuple(beta.shape)}"
            )

    checked = check_op(
        q, k, v, g, mode=mode, chunk_size=chunk_size, scale=scale,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, own=own,
    )  # fmt: skip
    check_atk(k, g_atk, beta_atk, x, eps, log_atk_scale, initial_A_state, checked.N)
    # fla's kernels take log_atk_scale as a tensor [H] only: a float stays on linattn's path
    if _backends.wanted(q) and not isinstance(log_atk_scale, (int, float)):
        # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("precond_delta_rule", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)  # (o, S, A)
    if _checks.flag("use_qk_l2norm", use_qk_l2norm):
        q, k = l2norm(q), l2norm(k)
    HV = checked.HV
    dtype = _engine.compute_dtype(v.dtype)
    # The memory is the oblique delta rule (``linattn.ops.rules.oblique``): written along
    # beta kp, read along k. Its write key is per value head (beta is): with grouped value heads
    # q and the read key are repeated onto them (the rule's keys and queries share heads).
    if mode == "chunk" and _native.applies(k) and k.shape[1] > 0 and v.dtype == k.dtype:
        # float32 on the CPU: the write keys straight from the scan (csrc/atk.cpp)
        write, A, read = _fused_write_keys(
            k, g_atk, beta_atk, beta, x=x, eps=eps, log_atk_scale=log_atk_scale,
            initial_A_state=initial_A_state, cu_seqlens=cu_seqlens,
        )  # fmt: skip
    else:
        kp, A = atk_preconditioner(
            k, g_atk, beta_atk, x=x, eps=eps, log_atk_scale=log_atk_scale,
            initial_A_state=initial_A_state, cu_seqlens=cu_seqlens, mode=mode,
        )  # fmt: skip
        write = beta.to(dtype).unsqueeze(-1) * _per_value_head(kp.to(dtype), HV)
        read = k
    o, S = _engine.run(
        _per_value_head(q, HV), write, v, _per_value_head(read, HV).to(dtype), g, scale=scale,
        mode=mode, chunk_size=checked.chunk_size, initial_state=initial_state,
        cu_seqlens=cu_seqlens, rule="oblique", keep_dtype=True,
    )  # fmt: skip
    o = o.to(v.dtype)
    S = S if checked.output_final_state else None
    return o, S, (A if checked.output_final_state else None)


def precond_delta_rule_step(
    state: Tensor,
    A_state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g_atk: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    x: float = X,
    eps: float = EPS,
    log_atk_scale: Tensor | float | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> Tensor:
    """One token of ``precond_delta_rule`` (decoding): both states updated in place.

    A <- exp(g_atk) A + beta_atk k^2, kp = x^(-s(A)) * k, then the memory's step
    (``recurrent_step`` with a = -beta kp, b = exp(g) * k, write kp (beta v)^T).

    Args:
        state: [B, HV, K, V] float32/float64; A_state: [B, H, K] in the state's dtype, >= 0.
        q, k: [B, H, K]; v: [B, HV, V]; g_atk, beta_atk: [B, H]; beta: [B, HV];
        g: None, [B, HV] or [B, HV, K]; x, eps, log_atk_scale, scale, use_qk_l2norm: as
        ``precond_delta_rule``.

    Returns:
        o_t: [B, HV, V] in v's dtype.
    """
    _checks.tensor("state", state, 4, finite=False)
    B, HV, K, V = state.shape
    _checks.tensor("q", q, 3)
    _checks.tensor("k", k, 3)
    H = k.shape[1]
    if tuple(k.shape) != (B, H, K) or q.shape != k.shape or H == 0 or HV % H:
        raise ValueError(
            f"q and k must have shape [B, H, K] with B, K = {(B, K)} and H dividing the state's "
            f"{HV} heads, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    _checks.tensor("A_state", A_state, 3)
    if tuple(A_state.shape) != (B, H, K) or A_state.dtype != state.dtype:
        raise ValueError(
            f"A_state must have shape [B, H, K] = {(B, H, K)} and the state's dtype "
            f"{state.dtype}, got {tuple(A_state.shape)} {A_state.dtype}"
        )
    for name, t, heads in (("g_atk", g_atk, H), ("beta_atk", beta_atk, H), ("beta", beta, HV)):
        _checks.tensor(name, t, 2)
        if tuple(t.shape) != (B, heads):
            raise ValueError(f"{name} must have shape {(B, heads)}, got {tuple(t.shape)}")
    check_atk(
        k.unsqueeze(1), g_atk.unsqueeze(1), beta_atk.unsqueeze(1), x, eps, log_atk_scale,
        A_state, B,
    )  # fmt: skip
    _checks.gate(g, B, HV, K, layout="[B, HV]")
    if _checks.flag("use_qk_l2norm", use_qk_l2norm):
        q, k = l2norm(q), l2norm(k)
    dtype = state.dtype
    kc = k.to(dtype)
    A_new = (
        torch.exp(g_atk.to(dtype)).unsqueeze(-1) * A_state
        + beta_atk.to(dtype).unsqueeze(-1) * kc.square()
    )
    kp = kc * squash(A_new, _center(log_atk_scale, H, dtype, k.device), x, eps)
    A_state.copy_(A_new)
    beta_v = beta.to(dtype).unsqueeze(-1)
    decay = 1.0 if g is None else torch.exp(g.to(dtype))
    if g is not None and g.dim() == 2:
        decay = decay.unsqueeze(-1)
    G = HV // H
    a = -beta_v * kp.repeat_interleave(G, 1)
    b = decay * kc.repeat_interleave(G, 1)
    o = recurrent_step(state, q.to(dtype), kp, beta_v * v.to(dtype), g=g, scale=scale, a=a, b=b)
    return o.to(v.dtype)
