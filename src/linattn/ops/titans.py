"""Titans' linear memory: gradient descent with momentum and weight decay at test time.

Behrouz et al. (2024), "Titans: Learning to Memorize at Test Time", section 3.1, as fla 0.6.0
computes it (``fla.ops.titans``; oracle ``linattn.reference.titans``, which states the definition
and fla's surprise term ``u_t`` in full):

    S_t = eta_t S_{t-1} - 2 theta_t k_t^T u_t(M'),   M_t = (1 - alpha_t) M_{t-1} + S_t,
    o_t = q_t M_t + LN_{w,b}(q_t M_t)

with ``M'`` the memory at the start of the token's chunk (section 3.2). Two memories (M and the
momentum S), a gradient through a layer norm: not one matrix updated per token. Two forms
(PyTorch, autograd gradients):

- ``mode="recurrent"``: token by token, the recurrence above;
- ``mode="chunk"`` (section 3.2's parallel form): a chunk of L tokens from (M_0, S_0), with
  ``A[t, i] = prod_{i < s <= t} (1 - alpha_s)``, ``E[i, j] = prod_{j < s <= i} eta_s`` (lower
  triangular) and ``U_j = -2 theta_j k_j^T u_j``:

      M_t = beta_t M_0 + f_t S_0 + sum_{j <= t} G[t, j] U_j,   G = A E,  f = A m,
      S_t = m_t S_0 + sum_{j <= t} E[t, j] U_j,    beta_t = prod_{s <= t} (1 - alpha_s),
      m_t = prod_{s <= t} eta_s,

  so ``o_t = beta_t q_t M_0 + f_t q_t S_0 - 2 sum_j G[t, j] theta_j (q_t . k_j) u_j``. The products
  are cumulative products (no logarithms: eta = 0 and alpha = 1 are allowed).

K = V = D (the target ``v - k``). The chunk size is the method's (which tokens share a gradient
point), not a tiling choice: it changes the result.

On float32 CPU tensors with the compiled kernels loaded (eager, not traced), the chunk form runs
fused in C++, forward and backward (``csrc/ttt.cpp``, beside TTT-Linear's, whose Titans header
gives the steps: the chunk's scalar recurrence of (1 - alpha, eta) as coefficients of M0, S0 and
the writes, and its adjoint), as TTT-Linear's does (``linattn.ops.ttt``; ``_FusedTitans``).
float64, other dtypes and devices, and the recurrent form run the PyTorch code below.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import _native, checks
from linattn.ops.ttt import _fused, _rows, layer_norm, saved_every

TitansState = tuple[Tensor, Tensor]
MODES = ("recurrent", "chunk")


def surprise(k: Tensor, v: Tensor, M: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """fla's u_t, row by row: ``D g - sum(g) / (sigma D) - x_hat sum(g x_hat) / (sigma D)`` with
    ``x = k M``, ``g = w * (LN_{w,b}(x) - (v - k))`` (``linattn.reference.titans.surprise``)."""
    x = k @ M
    D = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    sigma = torch.sqrt((x - mean).square().mean(-1, keepdim=True) + eps)
    x_hat = (x - mean) / sigma
    g = w * (w * x_hat + b - (v - k))
    return D * g - (g.sum(-1, keepdim=True) + x_hat * (g * x_hat).sum(-1, keepdim=True)) / (
        sigma * D
    )


def _products(x: Tensor) -> Tensor:
    """P[..., i, j] = prod_{j < s <= i} x_s for i >= j, zero above the diagonal: x [..., L]."""
    L = x.shape[-1]
    later = torch.ones(L, L, dtype=torch.bool, device=x.device).tril(-1)  # s > j, row s
    factors = torch.where(later, x.unsqueeze(-1), torch.ones_like(x).unsqueeze(-1))
    return torch.cumprod(factors, dim=-2).tril()


def _sequence(q, k, v, theta, alpha, eta, w, b, M, S, eps, size, mode):
    """One sequence (or a batch of equal ones): q, k, v [B, H, T, D], the rates [B, H, T, 1]."""
    T = q.shape[2]
    if mode == "chunk":
        # the whole chunks at once, then a short last chunk as one of its own
        whole = T - T % size
        x = (q, k, v, theta, alpha, eta)
        z, M, S = _chunks(*(t[:, :, :whole] for t in x), w, b, M, S, eps, size)
        if whole == T:
            return z, M, S
        z_end, M, S = _chunks(*(t[:, :, whole:] for t in x), w, b, M, S, eps, T - whole)
        return torch.cat([z, z_end], dim=2), M, S
    outs = []
    for start in range(0, T, size):
        stop = min(start + size, T)
        qi, ki, vi, th, al, et = (x[:, :, start:stop] for x in (q, k, v, theta, alpha, eta))
        u = surprise(ki, vi, M, w, b, eps)  # every gradient at the chunk's first memory
        for t in range(stop - start):
            k_t = ki[:, :, t : t + 1]
            S = et[:, :, t : t + 1] * S - 2 * th[:, :, t : t + 1] * (
                k_t.transpose(-1, -2) @ u[:, :, t : t + 1]
            )
            M = (1 - al[:, :, t : t + 1]) * M + S
            outs.append(qi[:, :, t : t + 1] @ M)
    z = torch.cat(outs, dim=2) if outs else q.new_zeros(q.shape)
    return z, M, S


def _chunks(q, k, v, theta, alpha, eta, w, b, M, S, eps, size):
    """The chunk form (the module docstring) of T = n ``size`` tokens, [B, H, n, L, .] at once.

    Everything that does not read the memories (A, E, G = A E, beta, m, f = A m, the scores
    G * tril(Q K^T), the writes) is formed for all chunks before the loop, which carries only
    the surprise at each chunk's first memory and the two memories; the outputs follow from
    the memories entering every chunk at once after it."""
    B, H, T, D = q.shape
    if T == 0:
        return q.new_zeros(q.shape), M, S
    n = T // size
    q, k, v, theta, alpha, eta = (
        x.unflatten(2, (n, size)) for x in (q, k, v, theta, alpha, eta)
    )  # [B, H, n, L, .]
    A = _products(1 - alpha[..., 0])  # [B, H, n, L, L]
    E = _products(eta[..., 0])
    beta = torch.cumprod(1 - alpha, dim=-2)  # [B, H, n, L, 1]
    m = torch.cumprod(eta, dim=-2)
    G = A @ E
    f = A @ m
    written = -2 * (theta * k)  # U_j = written_j^T u_j
    into_M = (G[..., -1, :, None] * written).transpose(-1, -2)  # [B, H, n, D, L]
    into_S = (E[..., -1, :, None] * written).transpose(-1, -2)
    beta_L, f_L, m_L = beta[..., -1:, :], f[..., -1:, :], m[..., -1:, :]  # [B, H, n, 1, 1]
    # ``surprise`` with its input-only terms formed once: with g = w (w x_hat + b - (v - k)),
    # Dg = D g = D w^2 x_hat + shift and u = Dg - (sum Dg + x_hat sum(Dg x_hat)) / (sigma D^2)
    shift = D * w.unsqueeze(2) * (b.unsqueeze(2) - (v - k))

    def steps(x):  # [B, H, n, ...] -> n tensors [B H, ...] (views)
        return x.flatten(0, 1).unbind(1)

    w2 = (D * w * w).expand(B, H, 1, D).reshape(B * H, 1, D)
    M, S = M.flatten(0, 1), S.flatten(0, 1)  # [B H, D, D]
    reads_M, reads_S, us = [], [], []
    per_chunk = (q, k, shift, beta_L, f_L, m_L, into_M, into_S)
    for q_j, k_j, shift_j, beta_j, f_j, m_j, into_M_j, into_S_j in zip(
        *map(steps, per_chunk), strict=True
    ):
        reads_M.append(torch.bmm(q_j, M))  # what the outputs read of the memories
        reads_S.append(torch.bmm(q_j, S))
        x = torch.bmm(k_j, M)  # [B H, L, D]: the surprise at the chunk's first memory
        var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        x_hat = (x - mean) * rstd
        Dg = torch.addcmul(shift_j, w2, x_hat)
        c = torch.addcmul(Dg.sum(-1, keepdim=True), x_hat, (Dg * x_hat).sum(-1, keepdim=True))
        u = torch.addcmul(Dg, c, rstd, value=-1.0 / (D * D))
        us.append(u)
        M_next = torch.baddbmm(torch.addcmul(beta_j * M, f_j, S), into_M_j, u)
        S = torch.baddbmm(m_j * S, into_S_j, u)
        M = M_next
    qM, qS, u_all = (torch.stack(x, 1).unflatten(0, (B, H)) for x in (reads_M, reads_S, us))
    scores = torch.tril(q @ k.transpose(-1, -2)) * G  # G[t, j] (q_t . k_j)
    z = beta * qM + f * qS - 2 * scores @ (theta * u_all)
    M, S = M.unflatten(0, (B, H)), S.unflatten(0, (B, H))
    return z.flatten(2, 3), M, S


class _FusedTitans(torch.autograd.Function):
    """The chunk form on the compiled kernels (``csrc/ttt.cpp``, Titans' steps 1-12): q, k, v
    [B, T, H, D], w, b [H, D], theta, alpha, eta [B, T, H, 1], M0, S0 [B, H, D, D] ->
    (o [B, T, H, D], M, S). The forward keeps z and the memories entering every
    ``saved_every(L)``-th chunk; the backward recomputes those between."""

    @staticmethod
    def forward(ctx, q, k, v, w, b, theta, alpha, eta, M0, S0, eps: float, size: int):
        rates = (theta[..., 0], alpha[..., 0], eta[..., 0])
        o, z, M, S, Ms, Ss = _native.kernel("titans_forward")(
            q, k, v, *rates, w, b, M0, S0, eps, size, saved_every(size), True
        )
        ctx.save_for_backward(q, k, v, w, b, theta, alpha, eta, z, Ms, Ss)
        ctx.options = (eps, size)
        return o, M, S

    @staticmethod
    def backward(ctx, d_o, dM, dS):
        q, k, v, w, b, theta, alpha, eta, z, Ms, Ss = ctx.saved_tensors
        eps, size = ctx.options
        if d_o is None:
            d_o = torch.zeros_like(z)
        dM, dS = (None if x is None else x.contiguous() for x in (dM, dS))
        rates = (theta[..., 0], alpha[..., 0], eta[..., 0])
        dq, dk, dv, dtheta, dalpha, deta, dw, db, dM0, dS0 = _native.kernel("titans_backward")(
            q, k, v, *rates, w, b, Ms, Ss, z, _rows(d_o), dM, dS, eps, size, saved_every(size)
        )
        drates = (x.unsqueeze(-1) for x in (dtheta, dalpha, deta))
        return dq, dk, dv, dw, db, *drates, dM0, dS0, None, None


def _fused_sequence(q, k, v, w, b, theta, alpha, eta, M0, S0, eps: float, size: int):
    """One sequence (or a batch of equal ones) on the kernels: (o [B, T, H, D], M, S)."""
    q, k, v = (_rows(x) for x in (q, k, v))
    w, b, M0, S0 = (x.contiguous() for x in (w, b, M0, S0))
    inputs = (q, k, v, w, b, theta, alpha, eta, M0, S0)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _FusedTitans.apply(*inputs, eps, size)
    rates = (theta[..., 0], alpha[..., 0], eta[..., 0])
    o, _, M, S, _, _ = _native.kernel("titans_forward")(
        q, k, v, *rates, w, b, M0, S0, eps, size, 1, False
    )
    return o, M, S


def titans_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    b: Tensor,
    theta: Tensor,
    alpha: Tensor,
    eta: Tensor,
    *,
    eps: float = 1e-6,
    chunk_size: int = 16,
    mode: str = "chunk",
    initial_state: TitansState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, TitansState | None]:
    """Titans' linear memory (Behrouz et al. 2024, sections 3.1-3.2, as fla computes it):
    ``S_t = eta_t S_{t-1} - 2 theta_t k_t^T u_t(M')``, ``M_t = (1 - alpha_t) M_{t-1} + S_t``,
    ``o_t = q_t M_t + LN_{w,b}(q_t M_t)`` (the module docstring; oracle
    ``linattn.reference.titans.titans_linear``).

    Args:
        q, k, v: [B, T, H, D] (K = V = D; q is not scaled). w, b: [H, D], the layer norm's.
        theta, alpha, eta: [B, T, H, 1]: learning rate, forgetting gate, momentum.
        eps: the layer norm's. chunk_size: tokens sharing a gradient point (>= 1), from each
        sequence's start. mode: "recurrent" or "chunk".
        initial_state: None or (M [N, H, D, D], S [N, H, D, D]) (S the momentum).
        cu_seqlens: packed sequences (B = 1), N of them.

    Returns:
        (o [B, T, H, D] in q's dtype, (M, S) in the compute dtype or None).
    """
    B, T, H, K, V = checks.qkv(q, k, v)
    if K != V:
        raise ValueError(f"v must have the keys' width (the target is v - k): K = {K}, V = {V}")
    for name, x in (("w", w), ("b", b)):
        checks.tensor(name, x, 2)
        if tuple(x.shape) != (H, V):
            raise ValueError(f"{name} must have shape [H, V] = {(H, V)}, got {tuple(x.shape)}")
    for name, x in (("theta", theta), ("alpha", alpha), ("eta", eta)):
        checks.tensor(name, x, 4)
        if tuple(x.shape) != (B, T, H, 1):
            raise ValueError(
                f"{name} must have shape [B, T, H, 1] = {(B, T, H, 1)}, got {tuple(x.shape)}"
            )
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    size = checks.integer("chunk_size", chunk_size)
    if size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {size}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    output_final_state = checks.flag("output_final_state", output_final_state)
    N = checks.seqlens(cu_seqlens, B, T)
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError("initial_state must be None or a tuple (M, S)")
        for name, x in zip(("initial_state[0] (M)", "initial_state[1] (S)"), initial_state,
                           strict=True):  # fmt: skip
            checks.tensor(name, x, 4)
            if tuple(x.shape) != (N, H, K, V):
                raise ValueError(f"{name} must have shape {(N, H, K, V)}, got {tuple(x.shape)}")

    in_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    state = () if initial_state is None else tuple(initial_state)
    if _fused(mode, q, k, v, w, b, theta, alpha, eta, *state):
        M0, S0 = state if state else (q.new_zeros(N, H, K, V), q.new_zeros(N, H, K, V))
        if cu_seqlens is None:
            o, M, S = _fused_sequence(q, k, v, w, b, theta, alpha, eta, M0, S0, float(eps), size)
        else:
            bounds = cu_seqlens.tolist()
            parts = []
            for n, (a, c) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                rows = (x[:, a:c] for x in (q, k, v))
                rates = (x[:, a:c] for x in (theta, alpha, eta))
                args = (*rows, w, b, *rates, M0[n : n + 1], S0[n : n + 1], float(eps), size)
                parts.append(_fused_sequence(*args))
            o = torch.cat([p[0] for p in parts], dim=1)
            M, S = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
        return o, ((M, S) if output_final_state else None)
    q, k, v, theta, alpha, eta = (
        x.to(dtype).transpose(1, 2) for x in (q, k, v, theta, alpha, eta)
    )  # [B, H, T, D]
    w, b = (x.to(dtype)[None, :, None, :] for x in (w, b))
    if initial_state is None:
        M0 = S0 = q.new_zeros(N, H, K, V)
    else:
        M0, S0 = (x.to(dtype) for x in initial_state)
    rest = (w, b)
    if cu_seqlens is None:
        z, M, S = _sequence(q, k, v, theta, alpha, eta, *rest, M0, S0, float(eps), size, mode)
    else:
        bounds = cu_seqlens.tolist()
        parts, Ms, Ss = [], [], []
        for n, (a, c) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            z_n, M_n, S_n = _sequence(
                *(x[:, :, a:c] for x in (q, k, v, theta, alpha, eta)), *rest,
                M0[n : n + 1], S0[n : n + 1], float(eps), size, mode,
            )  # fmt: skip
            parts.append(z_n)
            Ms.append(M_n)
            Ss.append(S_n)
        z, M, S = torch.cat(parts, dim=2), torch.cat(Ms), torch.cat(Ss)
    o = (z + layer_norm(z, w, b, float(eps))).transpose(1, 2).to(in_dtype)
    return o, ((M, S) if output_final_state else None)
