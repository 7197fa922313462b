"""fla's Based (``fused_chunk_based``, ``parallel_based``; Arora et al. 2024, section 3.1): causal
attention with the second-order Taylor kernel of exp, normalised as fla's kernels do,

    o_t = sum_{s <= t} f(a_ts) v_s / (sum_{s <= t} f(a_ts) + 1e-6),
    f(a) = 1 + a + a^2 / 2,    a_ts = scale q_t^T k_s

(``use_norm=False``: the numerator alone). With the feature map phi = ``linattn.features.
taylor_exp`` (phi(q)^T phi(k) = f(scale q^T k)) it is linear attention (spec sections 3 and 4),
run by ``linear_attention`` on the values with a column of ones appended (the denominator); fla's
1e-6 is added after, as its kernels add it. The chunk form is ``polynomial_attention``'s: the
same linear attention, with f computed from the K-wide scores inside a chunk and the features
used only for the state. No states, no packed sequences (fla has neither).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.features import taylor_exp
from linattn.ops import checks as _checks
from linattn.ops import linear_attention
from linattn.ops.diagonal import empty as _empty

EPS = 1e-6  # fla's Based kernels: o / (z + 1e-6)
TAYLOR = (1.0, 1.0, 0.5)  # f(a) = 1 + a + a^2 / 2, Based's kernel (``polynomial_attention``)


def kernel_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    eps: float,
    normalize: bool,
    mode: str,
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor]:
    """sum_{s <= t} (phi_q_t^T phi_k_s) [v_s, 1] by ``linear_attention`` in the form ``mode``;
    returns (o [B, T, H, V], the denominator z [B, T, H]): o is divided by z + eps if
    ``normalize``."""
    V = v.shape[-1]
    ones = torch.ones_like(v[..., :1])
    out, _ = linear_attention(
        phi_q, phi_k, torch.cat([v, ones], dim=-1), scale=1.0, mode=mode, chunk_size=chunk_size
    )
    o, z = out[..., :V], out[..., V]
    return (o / (z[..., None] + eps) if normalize else o), z


def _feature_map(coefficients: tuple[float, float, float], scale: float, K: int):
    """The parts of phi(x) = [sqrt(c0), sqrt(c1 s) x, sqrt(c2) s vec(x x^T)] that a nonzero
    coefficient keeps: (their width D', the weight of the linear part or None and its first
    column, the weight of the second order or None and its first column)."""
    c0, c1, c2 = coefficients
    at = int(bool(c0))
    linear = ((c1 * scale) ** 0.5, at) if c1 else None
    at += K if c1 else 0
    second = (c2**0.5 * scale, at) if c2 else None
    return at + (K * K if c2 else 0), linear, second


def _features(x: Tensor, layout, out: Tensor) -> Tensor:
    """phi(x) [..., D'] into ``out`` (``_feature_map``'s layout; its constant column, if any,
    already written)."""
    _, linear, second = layout
    K = x.shape[-1]
    if linear is not None:
        weight, at = linear
        torch.mul(x, weight, out=out[..., at : at + K])
    if second is not None:
        weight, at = second
        pairs = out[..., at : at + K * K].unflatten(-1, (K, K))
        torch.mul(x.unsqueeze(-1) * weight, x.unsqueeze(-2), out=pairs)
    return out


def _feature_grad(x: Tensor, d_phi: Tensor, layout) -> Tensor:
    """The gradient of <d_phi, phi(x)> in x: the linear part's sqrt(c1 s) d_phi, and the second
    order's sqrt(c2) s (D + D^T) x with D the K x K block of d_phi."""
    _, linear, second = layout
    K = x.shape[-1]
    dx = torch.zeros_like(x)
    if linear is not None:
        weight, at = linear
        dx.add_(d_phi[..., at : at + K], alpha=weight)
    if second is not None:
        weight, at = second
        D = d_phi[..., at : at + K * K].unflatten(-1, (K, K))
        column = x.unsqueeze(-1)
        both = (D @ column).add_(D.transpose(-1, -2) @ column).squeeze(-1)
        dx.add_(both, alpha=weight)
    return dx


def _accumulate(S: Tensor, a: Tensor, b: Tensor) -> None:
    """S += a @ b in place for [B, H, ., .] tensors (one batched product, no temporary)."""
    B, H = S.shape[:2]
    S.view(B * H, *S.shape[2:]).baddbmm_(a.reshape(B * H, *a.shape[2:]),
                                         b.reshape(B * H, *b.shape[2:]))  # fmt: skip


class _PolynomialChunks(torch.autograd.Function):
    """n = sum_{s <= t} f(a_ts) [v_s, 1] (f(a) = c0 + c1 a + c2 a^2, a_ts = scale q_t^T k_s) in
    chunks (``polynomial_attention``); q, k [B, H, T, K], v [B, H, T, V]; returns [B, H, T, V + 1].

    Per chunk c, from the state S (the sum of phi(k_s) [v_s, 1]^T over the chunks before):
    n_c = (f(scale q_c k_c^T) masked causally) [v_c, 1] + phi(q_c) S, then S += phi(k_c)^T [v_c, 1].
    The backward runs the chunks last to first with the states the forward kept, and dS (the
    gradient of the state after chunk c): dphi(q_c) = dn_c S^T, dphi(k_c) = [v_c, 1] dS^T,
    d[v_c, 1] = phi(k_c) dS + A^T dn_c, dA = dn_c [v_c, 1]^T masked, da = dA f'(a), then dS
    += phi(q_c)^T dn_c; q and k take da's products and their features' chain rule."""

    @staticmethod
    def forward(ctx, q, k, v, coefficients, scale, C):
        B, H, T, K = q.shape
        V = v.shape[-1]
        c0, c1, c2 = coefficients
        layout = _feature_map(coefficients, scale, K)
        width = layout[0]
        starts = range(0, T, C)
        # The state entering each chunk, kept for the backward pass (on the extension's cached
        # pages: [chunks, B, H, D', V + 1]); without a gradient to come, one state in place.
        keep = any(ctx.needs_input_grad[:3])
        states = _empty((len(starts), B, H, width, V + 1), q) if keep else None
        S = q.new_zeros(B, H, width, V + 1)
        out = _empty((B, T, H, V + 1), q).transpose(1, 2)
        phi = q.new_empty(B, H, min(C, T), width)
        if c0:
            phi[..., 0] = c0**0.5
        mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril_().logical_not_()
        for index, t0 in enumerate(starts):
            t1 = min(t0 + C, T)
            qc, kc = q[:, :, t0:t1], k[:, :, t0:t1]
            vc = torch.cat([v[:, :, t0:t1], torch.ones_like(v[:, :, t0:t1, :1])], -1)
            a = (qc @ kc.transpose(-1, -2)).mul_(scale)
            A = (a * c2 + c1).mul_(a).add_(c0).masked_fill_(mask[: t1 - t0, : t1 - t0], 0)
            f = phi[:, :, : t1 - t0]
            n = torch.matmul(_features(qc, layout, f), S)
            out[:, :, t0:t1] = n.add_(A @ vc)
            if keep:
                states[index] = S
            _accumulate(S, _features(kc, layout, f).transpose(-1, -2), vc)
        if keep:
            ctx.save_for_backward(q, k, v, states)
        ctx.coefficients, ctx.scale, ctx.C = coefficients, scale, C
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dn):
        q, k, v, states = ctx.saved_tensors
        coefficients, scale, C = ctx.coefficients, ctx.scale, ctx.C
        c0, c1, c2 = coefficients
        B, H, T, K = q.shape
        layout = _feature_map(coefficients, scale, K)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dS = torch.zeros_like(states[0])
        phi_q = q.new_empty(B, H, min(C, T), layout[0])
        phi_k = torch.empty_like(phi_q)
        if c0:
            phi_q[..., 0] = phi_k[..., 0] = c0**0.5
        mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril_().logical_not_()
        starts = list(range(0, T, C))
        for index in range(len(starts) - 1, -1, -1):
            t0 = starts[index]
            t1 = min(t0 + C, T)
            S = states[index]
            qc, kc = q[:, :, t0:t1], k[:, :, t0:t1]
            vc = torch.cat([v[:, :, t0:t1], torch.ones_like(v[:, :, t0:t1, :1])], -1)
            dnc = dn[:, :, t0:t1]
            fq = _features(qc, layout, phi_q[:, :, : t1 - t0])
            fk = _features(kc, layout, phi_k[:, :, : t1 - t0])
            m = mask[: t1 - t0, : t1 - t0]
            a = (qc @ kc.transpose(-1, -2)).mul_(scale)
            A = (a * c2 + c1).mul_(a).add_(c0).masked_fill_(m, 0)
            dv[:, :, t0:t1] = (fk @ dS).add_(A.transpose(-1, -2) @ dnc)[..., :-1]
            d_phi_k = vc @ dS.transpose(-1, -2)
            d_phi_q = dnc @ S.transpose(-1, -2)
            dA = (dnc @ vc.transpose(-1, -2)).masked_fill_(m, 0)
            da = dA.mul_(a.mul_(2 * c2).add_(c1)).mul_(scale)
            dq[:, :, t0:t1] = (da @ kc).add_(_feature_grad(qc, d_phi_q, layout))
            dk[:, :, t0:t1] = (da.transpose(-1, -2) @ qc).add_(_feature_grad(kc, d_phi_k, layout))
            _accumulate(dS, fq.transpose(-1, -2), dnc)
        return dq, dk, dv, None, None, None


def polynomial_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coefficients: tuple[float, float, float],
    scale: float,
    eps: float,
    normalize: bool,
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor]:
    """Causal attention with the polynomial kernel f(a) = c0 + c1 a + c2 a^2 of a = scale q^T k
    (``coefficients`` (c0, c1, c2) >= 0: Based's (1, 1, 1/2), ReBased's (0, 0, 1)) in the chunk
    form: o_t = sum_{s <= t} f(a_ts) v_s (/ (z_t + eps) if ``normalize``), z_t = sum f(a_ts).

    It is linear attention on the feature map phi(x) = [sqrt(c0), sqrt(c1 s) x,
    sqrt(c2) s vec(x x^T)] (phi(q)^T phi(k) = f(a); spec sections 3 and 4; a zero coefficient's
    part left out): the state, summed chunk by chunk, is [D', V + 1] (D' = 1 + K + K^2 for
    Based, the normaliser its last column), but inside a chunk f(a) is computed from the K-wide
    scores (where linear attention on the features would multiply D'-wide rows), and the
    features of a chunk's tokens live only for its step. q, k [B, T, H, K], v [B, T, H, V] in
    their compute dtype; returns (o [B, T, H, V], z [B, T, H]).
    """
    V = v.shape[-1]
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    out = _PolynomialChunks.apply(qh, kh, vh, tuple(float(c) for c in coefficients),
                                  float(scale), int(chunk_size)).transpose(1, 2)  # fmt: skip
    o, z = out[..., :V], out[..., V]
    return (o / (z[..., None] + eps) if normalize else o), z


def _check(q, k, v, normalize_name: str, normalize: object) -> None:
    _core.check(q, k, v)
    if v.shape[2] != q.shape[2]:
        raise ValueError(f"v must have H = {q.shape[2]} heads as q, got {v.shape[2]}")
    _checks.flag(normalize_name, normalize)


def based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
    mode: str = "chunk",
    chunk_size: int = _core.CHUNK,
) -> Tensor:
    """Based (the module docstring) in the form ``mode``; q, k [B, T, H, K], v [B, T, H, V];
    o in q's dtype, computed in float32 (float64 for float64 inputs)."""
    _check(q, k, v, "use_norm", use_norm)
    _checks.scale(scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(_core.promote(q, k, v))
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if mode == "chunk":
        o, _ = polynomial_attention(q, k, v, TAYLOR, scale, EPS, use_norm, chunk_size)
    else:
        o, _ = kernel_attention(
            taylor_exp(q, scale), taylor_exp(k, scale), v, EPS, use_norm, mode, chunk_size
        )
    return o.to(q.dtype)


def fused_chunk_based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
) -> Tensor:
    """fla's ``fused_chunk_based``: Based by linattn's chunk form; returns o [B, T, H, V]."""
    return based(q, k, v, scale, use_norm, mode="chunk", chunk_size=16)


def parallel_based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
) -> Tensor:
    """fla's ``parallel_based``: Based by linattn's parallel (masked T x T) form."""
    return based(q, k, v, scale, use_norm, mode="parallel")
