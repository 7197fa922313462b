"""MesaNet (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally Optimal Test-Time
Training"): two gated additive memories and a conjugate-gradient solve per token.

    H_t = gamma_t H_{t-1} + beta_t k_t k_t^T,   G_t = gamma_t G_{t-1} + beta_t k_t v_t^T
    q*_t = (H_t + Diag(lamb))^{-1} q_t          (conjugate gradients, fla's iteration)
    o_t  = G_t^T q*_t

with gamma_t = exp(g_t), lamb [H, K] one ridge per head and key channel (spec section 7.3: the
least-squares memory, regularised; ``linattn.reference.mesa`` is the exact-solve oracle).

Forms. ``recurrent`` builds H_t and G_t token by token and solves every token at once;
``chunk`` keeps the two states at chunk boundaries only, and applies H_t to a vector p_t as
``exp(G_i) H_chunk p_t + sum_{j <= i} exp(G_i - G_j) beta_j k_j (k_j^T p_t) + lamb p_t`` (the
gated additive memory's chunked read, spec section 8, with keys as values), as fla's kernel does;
``parallel`` is the chunk form with one chunk of T tokens. ``mesa_net_step`` is one token of
generation (fla's ``mesa_net_decoding_one_step``).

The solve is fla's conjugate gradients: x_0 = 0 (the step: Jacobi's q / (diag H + lamb + 1e-5)),
r_0 = q, and ``max_cg_iterations`` rounds of alpha = |r|^2 / (p^T A p + 1e-5),
beta = |r_new|^2 / (|r|^2 + 1e-5) (fla's 1e-5 in both denominators, ``CG_EPS``). ``cg_tol`` > 0
stops early once every token's residual is below ``cg_tol |q_t|`` (tokens that are done are
frozen); ``cg_eps`` replaces fla's 1e-5 (0: textbook conjugate gradients, which converge in at
most K steps in exact arithmetic; fla's guard damps every step once |r|^2 nears 1e-5, and the
error to the exact solve then stalls near 1e-3). The gradient is the implicit one, as fla's:
with q* = A^{-1} q, dq = A^{-1} dq* (one more
solve with the same iterations) and dA = -dq q*^T, which autograd carries into H (k, g, beta,
the initial state) and lamb.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from linattn.ops import checks

CG_EPS = 1e-5  # fla's guard in both of conjugate gradients' denominators
MODES = ("chunk", "recurrent", "parallel")


def conjugate_gradient(
    matvec: Callable[[Tensor], Tensor],
    b: Tensor,
    max_iterations: int,
    tol: float = 0.0,
    x0: Tensor | None = None,
    eps: float = CG_EPS,
) -> Tensor:
    """Solve A x = b for every vector of ``b`` [..., K] at once (A symmetric positive definite,
    applied by ``matvec``), by fla's conjugate gradients (the module docstring); ``eps`` is the
    guard added to both denominators (fla's 1e-5; 0 gives textbook CG, a 0/0 read as 0)."""
    x = torch.zeros_like(b) if x0 is None else x0
    r = b if x0 is None else b - matvec(x)
    p = r
    delta = (r * r).sum(-1)
    bound = (tol * b.norm(dim=-1)) ** 2 if tol > 0 else None
    for _ in range(max_iterations):
        Ap = matvec(p)
        alpha = _ratio(delta, (p * Ap).sum(-1) + eps)
        if bound is not None:
            active = delta > bound
            if not bool(active.any()):
                break
            alpha = torch.where(active, alpha, torch.zeros_like(alpha))
        x = x + alpha.unsqueeze(-1) * p
        r = r - alpha.unsqueeze(-1) * Ap
        delta_new = (r * r).sum(-1)
        p = r + _ratio(delta_new, delta + eps).unsqueeze(-1) * p
        delta = delta_new
    return x


def _ratio(a: Tensor, b: Tensor) -> Tensor:
    return torch.where(b != 0, a / torch.where(b != 0, b, torch.ones_like(b)), torch.zeros_like(a))


class _Solve(torch.autograd.Function):
    """q* = A(params)^{-1} q by conjugate gradients, with the implicit gradient (module
    docstring)."""

    @staticmethod
    def forward(ctx, matvec, cg, b, *params):  # type: ignore[override]
        with torch.no_grad():
            x = conjugate_gradient(lambda p: matvec(p, *params), b, *cg)
        ctx.matvec, ctx.cg = matvec, cg
        ctx.save_for_backward(x, *params)
        return x

    @staticmethod
    def backward(ctx, dx):  # type: ignore[override]
        x, *params = ctx.saved_tensors
        matvec = ctx.matvec
        with torch.no_grad():
            y = conjugate_gradient(lambda p: matvec(p, *params), dx, *ctx.cg)
        needs = ctx.needs_input_grad[3:]
        grads: list[Tensor | None] = [None] * len(params)
        if any(needs):
            with torch.enable_grad():
                leaves = [p.detach().requires_grad_(n) for p, n in zip(params, needs, strict=False)]
                wanted = [leaf for leaf, n in zip(leaves, needs, strict=False) if n]
                found = torch.autograd.grad(
                    matvec(x, *leaves), wanted, grad_outputs=-y, allow_unused=True
                )
            found_iter = iter(found)
            grads = [next(found_iter) if n else None for n in needs]
        return (None, None, y if ctx.needs_input_grad[2] else None, *grads)


def _chunk_matvec(P, Hs, kc, M, eq, lamb):
    # H_t p_t in the chunk form: the state entering the chunk (H p, not p^T H: the same for a
    # symmetric H, but the gradient of a user's initial state is that of H p), the chunk's own
    # keys, the ridge
    return (P * eq) @ Hs.transpose(-1, -2) + ((P @ kc.transpose(-1, -2)) * M) @ kc + lamb * P


def _token_matvec(P, Hs, lamb):
    return (Hs @ P.unsqueeze(-1)).squeeze(-1) + lamb * P


def _chunk(q, k, v, g, beta, lamb, h_kk, h_kv, C, cg):
    """One batch of equal-length sequences, heads first: q, k [B, H, T, K], v [B, H, T, V],
    g, beta [B, H, T], lamb [H, K], states [B, H, K, K] and [B, H, K, V]."""
    B, H, T, K = k.shape
    N = -(-T // C)
    pad = N * C - T
    if pad:  # trailing tokens with beta = 0 and g = 0 leave both states as they are
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    qc, kc, vc = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    G = g.reshape(B, H, N, C).cumsum(-1)
    bc = beta.reshape(B, H, N, C)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    M = diff.exp() * bc.unsqueeze(-2)
    eq = G.exp().unsqueeze(-1)
    Hs, Gs = [], []
    for n in range(N):
        Hs.append(h_kk)
        Gs.append(h_kv)
        last = G[:, :, n, -1:]
        ke = kc[:, :, n] * (bc[:, :, n] * (last - G[:, :, n]).exp()).unsqueeze(-1)
        decay = last.exp().unsqueeze(-1)
        h_kk = decay * h_kk + ke.transpose(-1, -2) @ kc[:, :, n]
        h_kv = decay * h_kv + ke.transpose(-1, -2) @ vc[:, :, n]
    Hs, Gs = torch.stack(Hs, 2), torch.stack(Gs, 2)
    ridge = lamb.view(1, H, 1, 1, K)
    x = _Solve.apply(_chunk_matvec, cg, qc, Hs, kc, M, eq, ridge)
    o = (x * eq) @ Gs + ((x @ kc.transpose(-1, -2)) * M) @ vc
    return o.reshape(B, H, N * C, v.shape[-1])[:, :, :T], h_kk, h_kv  # (B = 0: no -1 to infer)


def _recurrent(q, k, v, g, beta, lamb, h_kk, h_kv, cg):
    B, H, T, K = k.shape
    Hs, Gs = [], []
    for t in range(T):
        gamma = g[:, :, t, None, None].exp()
        kb = k[:, :, t] * beta[:, :, t, None]
        h_kk = gamma * h_kk + kb.unsqueeze(-1) * k[:, :, t].unsqueeze(-2)
        h_kv = gamma * h_kv + kb.unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        Hs.append(h_kk)
        Gs.append(h_kv)
    if T == 0:
        return v.new_zeros(B, H, 0, v.shape[-1]), h_kk, h_kv
    Hs, Gs = torch.stack(Hs, 2), torch.stack(Gs, 2)
    x = _Solve.apply(_token_matvec, cg, q, Hs, lamb.view(1, H, 1, K))
    o = (x.unsqueeze(-2) @ Gs).squeeze(-2)
    return o, h_kk, h_kv


def _check(q, k, v, g, beta, lamb, h_kk_init, h_kv_init, mode, chunk_size, iterations, tol, eps,
           cu_seqlens):  # fmt: skip
    B, T, H, K, V = checks.qkv(q, k, v)
    if g is not None:
        checks.gate(g, B, T, H, K, channel_only=False)
        if g.dim() != 3:
            raise ValueError(f"g must have shape [B, T, H] = {(B, T, H)}, got {tuple(g.shape)}")
    checks.tensor("beta", beta, 3, finite=False)
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must have shape [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    low, _ = checks.value_range("beta", beta) if beta.numel() else (0.0, 0.0)  # none: no range
    if low < 0:
        raise ValueError(f"beta must be >= 0, got min {low}")
    checks.tensor("lamb", lamb, 2, finite=False)
    if tuple(lamb.shape) != (H, K):
        raise ValueError(f"lamb must have shape [H, K] = {(H, K)}, got {tuple(lamb.shape)}")
    low, _ = checks.value_range("lamb", lamb)
    if low <= 0:
        raise ValueError(f"lamb must be > 0 (H + Diag(lamb) positive definite), got min {low}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    chunk_size = checks.integer("chunk_size", chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    iterations = checks.integer("max_cg_iterations", iterations)
    if iterations < 0:
        raise ValueError(f"max_cg_iterations must be >= 0, got {iterations}")
    for name, x in (("cg_tol", tol), ("cg_eps", eps)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {x!r}")
    N = checks.seqlens(cu_seqlens, B, T)
    for name, s, width in (("h_kk_init", h_kk_init, K), ("h_kv_init", h_kv_init, V)):
        if s is None:
            continue
        checks.tensor(name, s, 4)
        if tuple(s.shape) != (N, H, K, width):
            raise ValueError(
                f"{name} must have shape [N, H, K, {'K' if width == K else 'V'}] = "
                f"{(N, H, K, width)}, got {tuple(s.shape)}"
            )
    return B, T, H, K, V, N, chunk_size, iterations


def mesa_net(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor,
    lamb: Tensor,
    *,
    mode: str = "chunk",
    chunk_size: int = 64,
    h_kk_init: Tensor | None = None,
    h_kv_init: Tensor | None = None,
    output_final_state: bool = False,
    max_cg_iterations: int = 30,
    cg_tol: float = 0.0,
    cg_eps: float = CG_EPS,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """MesaNet: o_t = G_t^T (H_t + Diag(lamb))^{-1} q_t (module docstring; von Oswald et al. 2025,
    spec section 7.3).

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H] log-decays <= 0 or None; beta: [B, T, H]
    >= 0; lamb: [H, K] > 0; h_kk_init [N, H, K, K], h_kv_init [N, H, K, V] (fla's layout, N = B
    or the number of packed sequences in ``cu_seqlens``). ``max_cg_iterations``, ``cg_tol`` and
    ``cg_eps`` set the solve (module docstring: fla's kernel is 30, 0, 1e-5; its 1e-5 guard
    stalls the solve near a residual of 1e-3, so that an exact solve needs ``cg_eps=0``, with
    which K + 2 or so iterations reach rounding in float64). Returns (o [B, T, H, V], h_kk, h_kv),
    the final states None unless ``output_final_state``. Computed in the promoted dtype of the
    inputs (float64 stays float64).
    """
    B, T, H, K, V, N, C, iterations = _check(
        q, k, v, g, beta, lamb, h_kk_init, h_kv_init, mode, chunk_size, max_cg_iterations,
        cg_tol, cg_eps, cu_seqlens,
    )  # fmt: skip
    cg = (iterations, float(cg_tol), None, float(cg_eps))
    dtype = torch.promote_types(q.dtype, torch.float32)
    heads = [x.to(dtype).transpose(1, 2) for x in (q, k, v)]
    g = torch.zeros(B, T, H, dtype=dtype, device=q.device) if g is None else g.to(dtype)
    gb = [x.to(dtype).transpose(1, 2) for x in (g, beta)]
    lamb = lamb.to(dtype)
    h_kk0 = q.new_zeros(N, H, K, K, dtype=dtype) if h_kk_init is None else h_kk_init.to(dtype)
    h_kv0 = q.new_zeros(N, H, K, V, dtype=dtype) if h_kv_init is None else h_kv_init.to(dtype)

    def run(sl, s_kk, s_kv):
        args = [x[:, :, sl] for x in (*heads, *gb)]
        if mode == "recurrent":
            return _recurrent(*args, lamb, s_kk, s_kv, cg)
        size = C if mode == "chunk" else max(args[0].shape[2], 1)
        return _chunk(*args, lamb, s_kk, s_kv, size, cg)

    if cu_seqlens is None:
        o, h_kk, h_kv = run(slice(None), h_kk0, h_kv0)
    else:
        bounds = cu_seqlens.tolist()
        spans = enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        pieces = [run(slice(a, b), h_kk0[n : n + 1], h_kv0[n : n + 1]) for n, (a, b) in spans]
        o = torch.cat([p[0] for p in pieces], dim=2)
        h_kk = torch.cat([p[1] for p in pieces])
        h_kv = torch.cat([p[2] for p in pieces])
    o = o.transpose(1, 2).to(v.dtype)
    if not output_final_state:
        return o, None, None
    return o, h_kk, h_kv


def mesa_net_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    lamb: Tensor,
    beta: Tensor,
    h_kk: Tensor,
    h_kv: Tensor,
    max_cg_iterations: int = 30,
    cg_eps: float = CG_EPS,
) -> tuple[Tensor, Tensor, Tensor]:
    """One token of MesaNet (generation): q, k [B, H, K], v [B, H, V], g, beta [B, H],
    lamb [H, K], states [B, H, K, K] and [B, H, K, V]. Returns (o [B, H, V], new h_kk, new h_kv)
    with o = G^T (H + Diag(lamb))^{-1} q solved from Jacobi's start q / (diag H + lamb + 1e-5), as
    fla's ``mesa_net_decoding_one_step`` (module docstring)."""
    for name, x, ndim in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("g", g, 2), ("beta", beta, 2),
                          ("lamb", lamb, 2), ("h_kk", h_kk, 4), ("h_kv", h_kv, 4)):  # fmt: skip
        checks.tensor(name, x, ndim)
    B, H, K = q.shape
    V = v.shape[-1]
    expected = {
        "k": (k, (B, H, K)), "v": (v, (B, H, V)), "g": (g, (B, H)), "beta": (beta, (B, H)),
        "lamb": (lamb, (H, K)), "h_kk": (h_kk, (B, H, K, K)), "h_kv": (h_kv, (B, H, K, V)),
    }  # fmt: skip
    for name, (x, shape) in expected.items():
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    iterations = checks.integer("max_cg_iterations", max_cg_iterations)
    dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v, g, beta, lamb = (x.to(dtype) for x in (q, k, v, g, beta, lamb))
    gamma = g.exp()[..., None, None]
    kb = k * beta.unsqueeze(-1)
    h_kk = gamma * h_kk.to(dtype) + kb.unsqueeze(-1) * k.unsqueeze(-2)
    h_kv = gamma * h_kv.to(dtype) + kb.unsqueeze(-1) * v.unsqueeze(-2)
    x0 = q / (torch.diagonal(h_kk, dim1=-2, dim2=-1) + lamb + CG_EPS)
    matvec = lambda p: _token_matvec(p, h_kk, lamb)  # noqa: E731
    x = conjugate_gradient(matvec, q, iterations, x0=x0, eps=float(cg_eps))
    o = (x.unsqueeze(-2) @ h_kv).squeeze(-2)
    return o, h_kk, h_kv
