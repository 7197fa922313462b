"""The momentum delta rule (Momentum DeltaNet, arXiv:2605.05838; fla 0.6.0's
``fla.ops.momentum_delta_rule``): the delta rule's gradient step taken with heavy-ball momentum,
a second state M [K, V] next to the memory S:

    w_t = v_t - S_{t-1}^T p_t                      (the error of the read key p)
    M_t = mu_t M_{t-1} - eta_t k_t w_t^T           (the momentum: a decayed sum of gradients)
    S_t = alpha_t S_{t-1} - beta_t M_t,            o_t = S_t^T (scale q_t)

alpha_t = exp(log_alpha_t), mu_t = exp(log_mu_t) (both decays <= 1), beta_t the step and eta_t
the gradient's weight. The pair Z = [S; M] (2K x V) is one linear memory whose transition,
E_t (x) I_K + a_t p_t^T with E_t = [[alpha_t, -beta_t mu_t], [0, mu_t]], is neither diagonal
plus low rank nor a rule of ``linattn.ops.rules`` (its 2 x 2 block mixes S and M, with
coefficients that change every token), so this module has its own forms:

- recurrent: the token loop above;
- chunk (and parallel, one chunk of T): within a chunk the products of the E's are 2 x 2
  upper-triangular matrices known in closed form from the cumulative log-decays,

      Phi(i, j) = E_i ... E_{j+1} = [[a(i, j), c(i, j)], [0, m(i, j)]],
      a(i, j) = exp(A_i - A_j),  m(i, j) = exp(M_i - M_j),
      c(i, j) = -sum_{j < l <= i} a(i, l) beta_l m(l, j)     (a product of two masked matrices)

  (A, M the cumulative sums of log_alpha, log_mu; every exponent <= 0). With
  Z_t = Phi(t, 0) Z_0 + sum_{s <= t} Phi(t, s) (eta_s k_s (x) [beta_s; -1]) w_s^T, the errors
  of a chunk solve one unit-lower-triangular system,

      w_t + sum_{s < t} g(t - 1, s) eta_s (p_t . k_s) w_s = v_t - S_{t-1}'s part from Z_0,
      g(i, s) = a(i, s) beta_s - c(i, s),

  and the outputs and the chunk's final S, M follow by matrix products.

Packed sequences (``cu_seqlens``), the state pair in fla's layout ([2, N, H, K, V]: S and M
stacked) and gradients (autograd) in every form; ``momentum_delta_rule_step`` is the decoding
step. On float32 CPU tensors with the compiled kernels loaded (``linattn.ops._native``; eager,
not traced), the chunk form runs fused in C++ (``csrc/momentum.cpp``: the same algebra, forward
and backward, one (sequence, head) a chunk at a time); float64 and everything else run the
PyTorch forms here. fla 0.6.0 has no kernel for this family (its entry points run PyTorch
reference code), so the op never dispatches to fla.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _engine, _native
from linattn.ops import checks as _checks
from linattn.ops._blockmath import unit_lower_inverse
from linattn.ops.functional import l2norm
from linattn.ops.library import eager_float32_cpu

CHUNK_SIZE = 64
MODES = ("parallel", "recurrent", "chunk")


def _recurrent(q, k, v, p, la, lm, beta, eta, S, M):
    """The token loop on [B, H, T, .] tensors (q scaled); returns (o [B, H, T, V], S, M)."""
    outs = []
    for t in range(q.shape[2]):
        w = v[:, :, t] - torch.einsum("bhk,bhkv->bhv", p[:, :, t], S)
        M = torch.exp(lm[:, :, t])[..., None, None] * M - torch.einsum(
            "bhk,bhv->bhkv", eta[:, :, t, None] * k[:, :, t], w
        )
        S = torch.exp(la[:, :, t])[..., None, None] * S - beta[:, :, t, None, None] * M
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    o = torch.stack(outs, 2) if outs else v.new_zeros(v.shape)
    return o, S, M


def _decays(log_decay: Tensor) -> Tensor:
    """exp(C_i - C_j) for positions 0..c (C the cumulative sum, C_0 = 0), zero where j > i:
    [B, H, c + 1, c + 1]. C does not increase (log-decays <= 0, and rounding keeps a sum of
    nonpositive terms from growing), so clamping at 0 changes only the entries above the
    diagonal, which the mask then zeroes: no infinite exponent is formed (a mask of -inf costs
    a masked fill over the whole block)."""
    C = torch.nn.functional.pad(log_decay.cumsum(-1), (1, 0))
    return torch.exp((C[..., :, None] - C[..., None, :]).clamp_(max=0)).tril()


# The state-independent terms are formed a block of chunks at a time: a block's terms (its
# [chunks, B H, C + 1, C + 1] decays above all) stay about this many numbers, so they stay in
# the cache, and no intermediate is large enough for the allocator to map fresh pages for it.
BLOCK_NUMBERS = 1 << 18


def _chunk(q, k, v, p, la, lm, beta, eta, S, M, C: int):
    """The chunk form (module docstring) on [B, H, T, .] tensors; returns (o, S, M).

    Every term that does not read the state is formed for a block of chunks at once ([nb, B H,
    C, .], the chunks first, so that each chunk's terms are one contiguous block): the decays
    a, m, the weights g, the inverse T^-1 of the errors' system (``_terms``). The loop over the
    block's chunks then carries only the pair Z = [S; M] (W_j = T_j^-1 (V_j - [Ps_j | Pm_j] Z_j)
    and Z_{j+1}: three products a chunk), and the block's outputs follow from the pairs
    entering its chunks at once (``_scan``; ``_Block`` gives the backward). The
    sequence is padded to whole chunks with tokens that change nothing (zero keys, values,
    rates and log-decays: w = 0, M and S kept).
    """
    B, H, T = q.shape[:3]
    if T == 0:
        return v.new_zeros(v.shape), S, M
    n = -(-T // C)
    pad = n * C - T
    x = (q, k, v, p, la, lm, beta, eta)
    if pad:
        x = tuple(torch.nn.functional.pad(t, (0, 0) * (t.dim() - 3) + (0, pad)) for t in x)
    per_block = max(1, BLOCK_NUMBERS // (B * H * (C + 1) * (C + 1)))
    Z = torch.cat([S, M], dim=-2).flatten(0, 1)  # [B H, 2K, V]: the memory over the momentum
    outs = []
    # the blocks as views of one split (its gradient is one concatenation; a slice per block
    # would make a zero tensor of the whole for each block's gradient)
    for pieces in zip(*(t.split(per_block * C, dim=2) for t in x), strict=True):
        o_b, Z = _block(*(_chunks(t, C) for t in pieces), Z)
        outs.append(o_b.unflatten(1, (B, H)).movedim(0, 2).flatten(2, 3))  # [B, H, nb C, V]
    o = torch.cat(outs, 2)[:, :, :T]
    S, M = Z.unflatten(0, (B, H)).split(q.shape[3], dim=-2)
    return o, S, M


def _chunks(t: Tensor, C: int) -> Tensor:
    """t [B, H, nb C, ...] as its chunks [nb, B H, C, ...], contiguous."""
    t = t.unflatten(2, (t.shape[2] // C, C)).movedim(2, 0)
    return t.flatten(1, 2).contiguous()


def _block(q, k, v, p, la, lm, beta, eta, Z):
    """One block of chunks ([nb, P, C, .]) entering with Z = [S; M] [P, 2K, V]: (o [nb, P, C,
    V], Z) through ``_Block``, whose backward is written out (see there)."""
    return _Block.apply(q, k, v, p, la, lm, beta, eta, Z)


def _terms(q, k, p, la, lm, beta, eta):
    """The state-independent terms of a block's chunks ([nb, P, C, .]): a dict of the decays a,
    m, the weights g, the inverse Y = T^-1 and the scan's operands (``_scan``).

    The pair is one state: a chunk's errors read it through [Ps | Pm] (``reads``), it enters
    the next chunk through Phi(C, 0) (a 2 x 2 product over its halves, ``phi`` = (a, c, m) of
    [[a, c], [0, m]]), the errors write it through [g(C, s) eta_s k_s; -m(C, s) eta_s k_s]
    (``into``) and the outputs read it through [a(t, 0) q_t | c(t, 0) q_t] (``outs``).
    """
    a = _decays(la)  # [nb, P, C + 1, C + 1], positions 0..C
    m = _decays(lm)
    C = q.shape[2]
    b0 = torch.nn.functional.pad(beta, (1, 0))  # beta at positions 0..C (none at 0)
    # g(i, s) = a(i, s) beta_s - c(i, s) = sum_{s <= l <= i} a(i, l) beta_l m(l, s): the
    # product with the diagonal kept; and c(i, 0) = -g(i, 0), since beta_0 = 0
    bm = b0[..., :, None] * m
    g = a @ bm
    cross = -g[..., 0]  # c(i, 0)
    ek = eta[..., None] * k  # eta_s k_s
    ekT = ek.transpose(-1, -2)
    prev, now = slice(0, C), slice(1, C + 1)  # positions t - 1 and t of tokens t = 1..C
    # the errors: (I + L) W = V - a(t-1, 0) P S_0 - c(t-1, 0) P M_0, for every chunk
    PK = p @ ekT
    QK = q @ ekT
    t = dict(a=a, m=m, b0=b0, bm=bm, g=g, ek=ek, PK=PK, QK=QK)
    t["Y"] = _unit_lower_inverse(g[..., prev, 1:] * PK)
    t["reads"] = _pair(p, a[..., prev, 0], cross[..., prev])
    t["into"] = _pair(ek, g[..., -1, 1:], -m[..., -1, 1:]).transpose(-1, -2)  # [nb, P, 2K, C]
    t["phi"] = torch.stack([a[..., -1, 0], cross[..., -1], m[..., -1, 0]], dim=-1)
    t["scores"] = (g[..., now, 1:] * QK).tril_()
    t["outs"] = _pair(q, a[..., now, 0], cross[..., now])
    return t


INVERSE_LEAF = 16  # the size of the diagonal blocks inverted by one triangular solve


def _unit_lower_inverse(L: Tensor) -> Tensor:
    """(I + L)^-1 for L [..., C, C] strictly lower (its diagonal and upper triangle ignored), by
    halves: [[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]], both halves' inverses one
    batch, down to blocks of ``INVERSE_LEAF`` (or of odd size) that one batched triangular solve
    inverts. At C = 64 a batched solve against the identity runs far below the speed of a batched
    product on this CPU, and the halving moves all but a sixteenth of its work into products."""
    C = L.shape[-1]
    if C <= INVERSE_LEAF or C % 2:
        return unit_lower_inverse(L)
    h = C // 2
    halves = _unit_lower_inverse(torch.stack([L[..., :h, :h], L[..., h:, h:]]))
    Y = L.new_zeros(L.shape)
    Y[..., :h, :h], Y[..., h:, h:] = halves[0], halves[1]
    Y[..., h:, :h] = -(halves[1] @ L[..., h:, :h] @ halves[0])
    return Y


def _pair(x: Tensor, first: Tensor, second: Tensor) -> Tensor:
    """[first * x | second * x]: [nb, P, C, 2K] from x [nb, P, C, K]."""
    return torch.cat([x * first[..., None], x * second[..., None]], dim=-1)


def _pair_backward(d: Tensor, x: Tensor, first: Tensor, second: Tensor):
    """The gradients (dx, dfirst, dsecond) of ``_pair(x, first, second)`` for its gradient d."""
    d0, d1 = d.unflatten(-1, (2, -1)).unbind(-2)
    dx = torch.addcmul(d0 * first[..., None], d1, second[..., None])
    return dx, (d0 * x).sum(-1), (d1 * x).sum(-1)


def _decays_backward(da: Tensor, a: Tensor) -> Tensor:
    """The log-decays' gradient [.., c] from that of ``_decays`` (a [..., c + 1, c + 1]):
    a(i, j) = exp(C_i - C_j) gives dC = rows - columns of da * a, and C_i = sum_{l <= i} x_l
    gives dx_l = sum_{i >= l} dC_i."""
    dD = da * a
    dC = dD.sum(-1) - dD.sum(-2)
    return dC[..., 1:].flip(-1).cumsum(-1).flip(-1)


class _Block(torch.autograd.Function):
    """A block of chunks with its backward written out: the terms (``_terms``), the scan
    (``_scan``), then the terms' gradients by the chain rule through each product, as batched
    products over the block's chunks (autograd's graph of the same forward spends most of its
    backward on broadcast products and their reductions). Differentiable once, as the
    unit-lower inverse it replaces was."""

    @staticmethod
    def forward(ctx, q, k, v, p, la, lm, beta, eta, Z):
        t = _terms(q, k, p, la, lm, beta, eta)
        o, Zs, Ws = _scan(v, t["reads"], t["Y"], t["into"], t["phi"], t["outs"], t["scores"], Z)
        ctx.names = ("a", "m", "b0", "bm", "g", "ek", "PK", "QK", "Y", "reads", "into", "phi",
                     "outs", "scores")  # fmt: skip
        ctx.save_for_backward(q, k, p, eta, Zs, Ws, *(t[n] for n in ctx.names))
        return o, Zs[-1].clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dZ):
        q, k, p, eta, Zs, Ws, *rest = ctx.saved_tensors
        t = dict(zip(ctx.names, rest, strict=True))
        a, m, g, ek, PK, QK = t["a"], t["m"], t["g"], t["ek"], t["PK"], t["QK"]
        C = q.shape[2]
        prev, now = slice(0, C), slice(1, C + 1)
        cross = -g[..., 0]
        dv, dreads, dinto, dphi, douts, dscores, dZ0 = _scan_backward(
            t["reads"], t["Y"], t["into"], t["phi"], t["outs"], t["scores"], Zs, Ws, do, dZ
        )
        # (I + L)^-1's backward, -Y^T dY Y^T with dY = dW R^T, is -dR W^T (dR = Y^T dW and
        # W = Y R): one product instead of three; L is strictly lower
        dL = -(dv @ Ws.transpose(-1, -2)).tril_(-1)
        dscores = dscores.tril_()
        dPK = dL * g[..., prev, 1:]
        dQK = dscores * g[..., now, 1:]
        dg = torch.zeros_like(g)
        dg[..., prev, 1:] = dL * PK
        dg[..., now, 1:] += dscores * QK
        dp, da_prev, dc_prev = _pair_backward(dreads, p, a[..., prev, 0], cross[..., prev])
        dp.add_(dPK @ ek)
        dq, da_now, dc_now = _pair_backward(douts, q, a[..., now, 0], cross[..., now])
        dq.add_(dQK @ ek)
        dek, dg_last, dm_last = _pair_backward(
            dinto.transpose(-1, -2), ek, g[..., -1, 1:], -m[..., -1, 1:]
        )
        dek += dPK.transpose(-1, -2) @ p + dQK.transpose(-1, -2) @ q
        dg[..., -1, 1:] += dg_last
        dm = torch.zeros_like(m)
        dm[..., -1, 1:] = -dm_last
        dm[..., -1, 0] += dphi[..., 2]
        da = torch.zeros_like(a)
        da[..., prev, 0] = da_prev
        da[..., now, 0] += da_now
        da[..., -1, 0] += dphi[..., 0]
        dcross = torch.nn.functional.pad(dc_prev, (0, 1))
        dcross[..., now] += dc_now
        dcross[..., -1] += dphi[..., 1]
        dg[..., 0] -= dcross
        da.add_(dg @ t["bm"].transpose(-1, -2))
        dbm = a.transpose(-1, -2) @ dg
        dm.addcmul_(dbm, t["b0"][..., :, None])
        dbeta = (dbm * m).sum(-1)[..., 1:]
        dk = dek * eta[..., None]
        deta = (dek * k).sum(-1)
        dla, dlm = _decays_backward(da, a), _decays_backward(dm, m)
        return dq, dk, dv, dp, dla, dlm, dbeta, deta, dZ0


def _scan(v, reads, Y, into, phi, outs, scores, Z):
    """The pair through a block's chunks (``_terms``, [nb, P, ...]), and the outputs:

        W_j = Y_j (V_j - R_j Z_j),   Z_{j+1} = Phi_j Z_j + I_j W_j,
        O_j = Q_j Z_j + A_j W_j

    (Y = T^-1, R the reads [Ps | Pm], I the writes into the pair, Q the outputs' reads, A the
    chunk's scores). The errors are solved in the loop against the C x V right side; solving
    T^-1 [V | R] first would cost a C x C x 2K product a chunk more. Returns (O, the pairs
    entering each chunk and the last [nb + 1, P, 2K, V], the errors W).
    """
    nb, P = v.shape[:2]
    Zs = Z.new_empty((nb + 1, *Z.shape))
    Ws = torch.empty_like(v)
    Zs[0] = Z
    for j in range(nb):
        torch.bmm(Y[j], torch.baddbmm(v[j], reads[j], Zs[j], alpha=-1), out=Ws[j])
        (S, M), (S_next, M_next) = Zs[j].chunk(2, 1), Zs[j + 1].chunk(2, 1)
        a, c, m = phi[j, :, :, None, None].unbind(1)  # Phi Z = [a S + c M; m M], in place
        torch.mul(S, a, out=S_next).addcmul_(M, c)
        torch.mul(M, m, out=M_next)
        Zs[j + 1].baddbmm_(into[j], Ws[j])
    o = torch.bmm(outs.flatten(0, 1), Zs[:-1].flatten(0, 1))
    o.baddbmm_(scores.flatten(0, 1), Ws.flatten(0, 1))
    return o.unflatten(0, (nb, P)), Zs, Ws


def _scan_backward(reads, Y, into, phi, outs, scores, Zs, Ws, do, dZ):
    """``_scan``'s backward: the loop in reverse carrying only dZ; every other gradient is one
    product over the block's chunks. Returns the gradients of (v, reads, into, phi, outs, scores,
    Z); Y's follows from v's (``_Block.backward``)."""
    Zin = Zs[:-1]
    do = torch.zeros_like(Ws) if do is None else do.contiguous()
    dZ = torch.zeros_like(Zs[-1]) if dZ is None else dZ.contiguous()
    dWs = scores.transpose(-1, -2) @ do  # the outputs' part, the loop adds the pair's
    dZin = outs.transpose(-1, -2) @ do  # [nb, P, 2K, V]
    dZout = torch.empty_like(Zin)  # the gradient of the pair leaving each chunk
    dRs = torch.empty_like(Ws)
    for j in reversed(range(Ws.shape[0])):
        dZout[j] = dZ
        dWs[j].baddbmm_(into[j].transpose(-1, -2), dZ)
        torch.bmm(Y[j].transpose(-1, -2), dWs[j], out=dRs[j])
        dZ = dZin[j].baddbmm_(reads[j].transpose(-1, -2), dRs[j], alpha=-1)
        (dS, dM), (dS_next, dM_next) = dZ.chunk(2, 1), dZout[j].chunk(2, 1)
        a, c, m = phi[j, :, :, None, None].unbind(1)  # Phi^T dZ = [a dS; c dS + m dM]
        dS.addcmul_(dS_next, a)
        dM.addcmul_(dS_next, c).addcmul_(dM_next, m)
    dreads = -(dRs @ Zin.transpose(-1, -2))
    dinto = dZout @ Ws.transpose(-1, -2)
    S, M = Zin.unflatten(2, (2, -1)).unbind(2)
    dS, dM = dZout.unflatten(2, (2, -1)).unbind(2)
    dphi = torch.stack(
        [(dS * S).sum((-1, -2)), (dS * M).sum((-1, -2)), (dM * M).sum((-1, -2))], dim=-1
    )
    douts = do @ Zin.transpose(-1, -2)
    dscores = do @ Ws.transpose(-1, -2)
    return dRs, dreads, dinto, dphi, douts, dscores, dZ


# The largest chunk the compiled kernels take (csrc/momentum.cpp checks it too); a larger one runs
# the PyTorch form.
FUSED_MAX_CHUNK = 1024


class _FusedMomentum(torch.autograd.Function):
    """The chunk form on the compiled kernels (``csrc/momentum.cpp``: its header gives the
    forward's steps 1-6 and the backward's 7-9): q, k, p [TT, H, K], v [TT, H, V], the
    log-decays and rates [TT, H] (the sequences' tokens one after another, ``bounds`` their
    cumulative lengths), the pair Z0 [2, N, H, K, V] -> (o [TT, H, V], Z [2, N, H, K, V]). The
    forward keeps the pair entering every chunk and the errors w; every decay is a product of
    decays <= 1, so no chunk is too steep for float32."""

    @staticmethod
    def forward(ctx, q, k, v, p, la, lm, beta, eta, Z0, bounds: list[int], scale: float, C: int):
        o, Z, states, errors = _native.fused("momentum_forward")(
            q, k, v, p, la, lm, beta, eta, Z0, bounds, scale, C, True
        )
        ctx.save_for_backward(q, k, p, la, lm, beta, eta, states, errors)
        ctx.options = (bounds, scale, C)
        return o, Z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, dZ):
        q, k, p, la, lm, beta, eta, states, errors = ctx.saved_tensors
        bounds, scale, C = ctx.options
        d_o = torch.zeros_like(errors) if d_o is None else d_o.contiguous()
        dZ = None if dZ is None else dZ.contiguous()
        grads = _native.fused("momentum_backward")(
            q, k, p, la, lm, beta, eta, states, errors, d_o, dZ, bounds, scale, C
        )
        dq, dk, dv, dp, dla, dlm, dbeta, deta, dZ0 = grads
        return dq, dk, dv, dp, dla, dlm, dbeta, deta, dZ0, None, None, None


def _fused(q, k, v, p, la, lm, beta, eta, scale: float, C: int, Z0, N: int, cu_seqlens):
    """The chunk form on the compiled kernels (``_FusedMomentum``) in the public layouts: (o
    [B, T, H, V], the final pair [2, N, H, K, V])."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else [b * T for b in range(B + 1)]
    x = [t.reshape(B * T, *t.shape[2:]).contiguous() for t in (q, k, v, p, la, lm, beta, eta)]
    Z0 = v.new_zeros(2, N, H, K, V) if Z0 is None else Z0.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (*x, Z0)):
        o, Z = _FusedMomentum.apply(*x, Z0, bounds, scale, C)
    else:
        o, Z, _, _ = _native.fused("momentum_forward")(*x, Z0, bounds, scale, C, False)
    return o.view(B, T, H, V), Z


def _check(q, k, v, p, log_alpha, log_mu, beta, eta, mode, chunk_size, scale, S0, M0, cu_seqlens):
    B, T, H, K, V = _checks.qkv(q, k, v)
    _checks.tensor("p", p, 4)
    if p.shape != k.shape:
        raise ValueError(
            f"p must have k's shape [B, T, H, K] = {tuple(k.shape)}, got {tuple(p.shape)}"
        )
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu), ("beta", beta), ("eta", eta)):
        _checks.tensor(name, t, 3)
        if tuple(t.shape) != (B, T, H):
            raise ValueError(
                f"{name} must have shape [B, T, H] = {(B, T, H)}, got {tuple(t.shape)}"
            )
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu)):
        if t.numel() and float(t.detach().max()) > 0:
            raise ValueError(f"{name} is a log-decay and must be <= 0; got max {float(t.max())}")
    chunk_size = _checks.options(mode, chunk_size)
    _checks.scale(scale)
    N = _checks.seqlens(cu_seqlens, B, T)
    if S0 is not None and tuple(S0.shape) != (N, H, K, V):
        raise ValueError(
            f"initial_state must have shape [2, N, H, K, V] = {(2, N, H, K, V)} (N = batch size "
            f"or number of sequences in cu_seqlens), got {(2, *S0.shape)}"
        )
    return N, chunk_size


def momentum_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    p: Tensor,
    log_alpha: Tensor,
    log_mu: Tensor,
    beta: Tensor,
    eta: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    use_qk_l2norm: bool = True,
    use_p_times_alpha: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The momentum delta rule (Momentum DeltaNet, arXiv:2605.05838; the module docstring):

        w_t = v_t - S_{t-1}^T p_t,   M_t = mu_t M_{t-1} - eta_t k_t w_t^T,
        S_t = alpha_t S_{t-1} - beta_t M_t,   o_t = S_t^T (scale q_t)

    Args:
        q, k, p: [B, T, H, K] (p: the read key). v: [B, T, H, V].
        log_alpha, log_mu: [B, T, H], finite log-decays (<= 0). beta, eta: [B, T, H], finite.
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel" (one chunk of T), "recurrent" or "chunk"; chunk_size >= 1.
        initial_state: None (zeros) or the memory and the momentum stacked, [2, N, H, K, V]
            (fla's layout; N = B, or the number of sequences of cu_seqlens).
        output_final_state: return the final pair (else None).
        cu_seqlens: None or [N + 1] cumulative lengths (B = 1): packed sequences.
        use_qk_l2norm: normalise q, k and p first, x / sqrt(|x|^2 + 1e-6) (default True, fla's).
        use_p_times_alpha: read with alpha_t p_t instead of p_t (default True, fla's).

    Returns:
        (o [B, T, H, V] in v's dtype, S_T and M_T stacked, [2, N, H, K, V], in float32 (float64 for
        float64 inputs) or None).
    """
    if initial_state is not None:
        _checks.tensor("initial_state", initial_state, 5)
        if initial_state.shape[0] != 2:
            raise ValueError(
                "initial_state must stack the memory and the momentum, [2, N, H, K, V], got "
                f"{tuple(initial_state.shape)}"
            )
    S0, M0 = (None, None) if initial_state is None else (initial_state[0], initial_state[1])
    N, C = _check(
        q, k, v, p, log_alpha, log_mu, beta, eta, mode, chunk_size, scale, S0, M0, cu_seqlens
    )
    output_final_state = _checks.flag("output_final_state", output_final_state)
    _checks.finite({"beta": beta, "eta": eta, "log_alpha": log_alpha, "log_mu": log_mu})
    if _checks.flag("use_qk_l2norm", use_qk_l2norm):
        q, k, p = l2norm(q), l2norm(k), l2norm(p)
    if _checks.flag("use_p_times_alpha", use_p_times_alpha):
        p = p * log_alpha.exp().unsqueeze(-1).to(p.dtype)
    dtype = _engine.compute_dtype(q.dtype)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    rates = (log_alpha, log_mu, beta, eta)
    fits = mode == "chunk" and C <= FUSED_MAX_CHUNK
    if fits and eager_float32_cpu(q, k, v, p, *rates, initial_state):
        o, state = _fused(q, k, v, p, *rates, scale, C, initial_state, N, cu_seqlens)
        return o, (state if output_final_state else None)

    def heads(x):  # [B, T, H, ...] -> [B, H, T, ...] in the compute dtype
        return x.to(dtype).transpose(1, 2)

    tensors = [heads(t) for t in (q * scale, k, v, p, log_alpha, log_mu, beta, eta)]
    zeros = q.new_zeros((N, H, K, V), dtype=dtype)
    S0 = zeros if S0 is None else S0.to(dtype)
    M0 = zeros if M0 is None else M0.to(dtype)
    if mode == "recurrent":
        form = _recurrent
    else:
        size = max(T, 1) if mode == "parallel" else C

        def form(*x):
            return _chunk(*x, size)

    if cu_seqlens is None:
        o, S, M = form(*tensors, S0, M0)
    else:
        bounds = cu_seqlens.tolist()
        outs, Ss, Ms = [], [], []
        for n in range(N):
            s, e = bounds[n], bounds[n + 1]
            o_n, S_n, M_n = form(*(t[:, :, s:e] for t in tensors), S0[n : n + 1], M0[n : n + 1])
            outs.append(o_n)
            Ss.append(S_n)
            Ms.append(M_n)
        o, S, M = torch.cat(outs, 2), torch.cat(Ss), torch.cat(Ms)
    o = o.transpose(1, 2).to(v.dtype)
    return o, (torch.stack([S, M]) if output_final_state else None)


def momentum_delta_rule_step(
    state: Tensor,
    momentum: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    p: Tensor,
    log_alpha: Tensor,
    log_mu: Tensor,
    beta: Tensor,
    eta: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """One token of ``momentum_delta_rule`` (decoding), S and M updated in place.

    Args:
        state, momentum: [B, H, K, V], float32 or float64, one dtype.
        q, k, p: [B, H, K]; v: [B, H, V]; log_alpha, log_mu (<= 0), beta, eta: [B, H].
        scale: None means 1 / sqrt(K).

    Returns:
        o_t: [B, H, V] in v's dtype.
    """
    _checks.tensor("state", state, 4)
    B, H, K, V = state.shape
    _checks.tensor("momentum", momentum, 4)
    if momentum.shape != state.shape or momentum.dtype != state.dtype:
        raise ValueError(
            f"momentum must have the state's shape {tuple(state.shape)} and dtype {state.dtype}, "
            f"got {tuple(momentum.shape)} {momentum.dtype}"
        )
    for name, t, last in (("q", q, K), ("k", k, K), ("p", p, K), ("v", v, V)):
        _checks.tensor(name, t, 3)
        if tuple(t.shape) != (B, H, last):
            raise ValueError(f"{name} must have shape {(B, H, last)}, got {tuple(t.shape)}")
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu), ("beta", beta), ("eta", eta)):
        _checks.tensor(name, t, 2)
        if tuple(t.shape) != (B, H):
            raise ValueError(f"{name} must have shape {(B, H)}, got {tuple(t.shape)}")
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu)):
        if t.numel() and float(t.detach().max()) > 0:
            raise ValueError(f"{name} is a log-decay and must be <= 0; got max {float(t.max())}")
    _checks.scale(scale)
    scale = K**-0.5 if scale is None else scale
    d = state.dtype
    x = [t.to(d).unsqueeze(2) for t in (q * scale, k, v, p)]
    x += [t.to(d).unsqueeze(2) for t in (log_alpha, log_mu, beta, eta)]
    o, S, M = _recurrent(*x, state, momentum)
    state.copy_(S)
    momentum.copy_(M)
    return o[:, :, 0].to(v.dtype)
