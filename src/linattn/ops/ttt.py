"""TTT-Linear: a memory trained by one gradient step per mini-batch (Sun et al., 2024).

The hidden state is a linear model ``(W [K, V], h [1, V])`` with a layer norm ``LN_{w,b}`` and a
residual, trained at test time on ``l_t = 1/2 |LN(k_t W + h) - (v_t - k_t)|^2`` by mini-batch
gradient descent (``linattn.reference.ttt``, the float64 oracle, states the definition in full).
It is not one matrix updated per token: within a mini-batch every gradient is taken at the
state the mini-batch started from, and the layer norm makes the gradient nonlinear in it. Its
paper gives two forms of the same computation, both here (PyTorch, autograd gradients):

- ``mode="recurrent"``, the primal form: token by token, the running sums of the gradients
  ``sum_{s <= t} k_s^T grad_s`` and ``sum_{s <= t} grad_s`` give ``W_t``, ``h_t`` and the output;
- ``mode="chunk"``, the dual form (section 2.7): a mini-batch's gradients ``G`` [b, V] at once,
  then ``Z = Q W_0 + h_0 - diag(eta) (tril(Q K^T) + tril(1)) G`` and
  ``W <- W_0 - eta_b K^T G``, ``h <- h_0 - eta_b sum(G)``.

Both end with ``o = z + LN_{w,b}(z)``. With K = V (the residual target ``v - k``). The mini-batch
size is the method's (fla's ``chunk_size``), not a tiling choice: it changes the result.

On float32 CPU tensors with the compiled kernels loaded (``linattn.ops._native``; eager, not
traced), the dual form runs fused in C++, forward and backward (``csrc/ttt.cpp``, whose header
gives the steps of both): per (sequence, head) a loop over the mini-batches, the forward keeping
z (the final layer norm's input) and the state entering every few mini-batches (one per
``SAVED_TOKENS`` tokens), the backward a reverse loop over them that recomputes the states
between (``_FusedTTT``). float64, other dtypes and devices, and the recurrent form run the PyTorch
code below, autograd's gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import _native, checks
from linattn.ops import backends as _backends
from linattn.ops.library import tracing

TTTState = tuple[Tensor, Tensor]
MODES = ("recurrent", "chunk")


def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """w * (x - mean x) / sqrt(var x + eps) + b over the last dimension (biased variance)."""
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    return w * (x - mean) * torch.rsqrt(var + eps) + b


def loss_gradient(k: Tensor, v: Tensor, W: Tensor, h: Tensor, w: Tensor, b: Tensor, eps: float):
    """d l / d(k W + h) for l = 1/2 |LN_{w,b}(k W + h) - (v - k)|^2, row by row: [..., V].

    With x_hat the normalised row and ``g = w * (LN(x) - (v - k))``, the layer norm's backward is
    ``(g - mean(g) - x_hat mean(g x_hat)) / sigma``.
    """
    x = k @ W + h
    mean = x.mean(-1, keepdim=True)
    sigma = torch.sqrt((x - mean).square().mean(-1, keepdim=True) + eps)
    x_hat = (x - mean) / sigma
    g = w * (w * x_hat + b - (v - k))
    return (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)) / sigma


def _padding_gradient(W: Tensor, h: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """The gradient of one of fla's zero padding tokens (k = v = 0): [B, H, 1, V]."""
    zero = torch.zeros_like(h)
    return loss_gradient(zero[..., :, : W.shape[-2]], zero, W, h, w, b, eps)


def _sequence(q, k, v, eta, w, b, W, h, eps, size, mode):
    """One sequence (or a batch of equal ones): q, k, v [B, H, T, D], eta [B, H, T, 1]."""
    if mode == "chunk":
        return _dual(q, k, v, eta, w, b, W, h, eps, size)
    T = q.shape[2]
    outs = []
    for start in range(0, T, size):
        stop = min(start + size, T)
        qi, ki, vi, ei = (x[:, :, start:stop] for x in (q, k, v, eta))
        sum_W, sum_h = torch.zeros_like(W), torch.zeros_like(h)
        for t in range(stop - start):
            k_t, e_t = ki[:, :, t : t + 1], ei[:, :, t : t + 1]
            g_t = loss_gradient(k_t, vi[:, :, t : t + 1], W, h, w, b, eps)
            sum_W = sum_W + k_t.transpose(-1, -2) @ g_t
            sum_h = sum_h + g_t
            outs.append(qi[:, :, t : t + 1] @ (W - e_t * sum_W) + h - e_t * sum_h)
        padding = size - (stop - start)
        if padding:
            sum_h = sum_h + padding * _padding_gradient(W, h, w, b, eps)
        e_last = ei[:, :, -1:]
        W, h = W - e_last * sum_W, h - e_last * sum_h
    z = torch.cat(outs, dim=2) if outs else q.new_zeros(q.shape)
    return z, W, h


def _dual(q, k, v, eta, w, b, W, h, eps, size):
    """The dual form (the module docstring) of one sequence, its mini-batches [B, H, n, b, D].

    A short last mini-batch is padded with fla's zero tokens (k = v = q = 0: their gradient is
    the padding's, grad_h at k = 0; eta padded with the last token's, which is the step's rate),
    so every mini-batch is whole. The loop carries only the gradient step (the gradients G at the
    mini-batch's first state, then W and h); everything that does not read the state (the target
    v - k, the scores tril(Q K^T + 1), the rates) is formed for all mini-batches at once before
    it, and the outputs Z = Q W_0 + h_0 - diag(eta) A G from the states entering every
    mini-batch at once after it.
    """
    B, H, T, D = q.shape
    if T == 0:
        return q.new_zeros(q.shape), W, h
    n = -(-T // size)
    pad = n * size - T

    def batches(x, mode="constant"):  # [B, H, T, D] -> [B, H, n, b, D]
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad), mode=mode)
        return x.unflatten(2, (n, size))

    q, k, v = batches(q), batches(k), batches(v)
    eta = batches(eta, "replicate")
    # g = w (w x_hat + b - (v - k)) = w^2 x_hat + shift, for every mini-batch [B, H, n, b, D]
    shift = w.unsqueeze(2) * (b.unsqueeze(2) - (v - k))
    e_last = eta[..., -1:, :]  # [B, H, n, 1, 1]: each step's rate
    kT = (e_last * k).transpose(-1, -2)  # [B, H, n, D, b]: W <- W - e kT G
    rate = e_last.expand(-1, -1, -1, 1, size)  # [B, H, n, 1, b]: h <- h - e 1^T G

    def steps(x):  # [B, H, n, ...] -> n tensors [B H, ...] (views)
        return x.flatten(0, 1).unbind(1)

    w2 = (w * w).expand(B, H, 1, D).reshape(B * H, 1, D)
    W, h = W.flatten(0, 1), h.flatten(0, 1)  # [B H, D, D], [B H, 1, D]
    reads, grads = [], []
    for q_j, k_j, shift_j, kT_j, rate_j in zip(*map(steps, (q, k, shift, kT, rate)), strict=True):
        reads.append(torch.baddbmm(h, q_j, W))  # Q W_0 + h_0: what the outputs read of the state
        x = torch.baddbmm(h, k_j, W)  # [B H, b, D]
        var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
        rstd = torch.rsqrt(var + eps)
        x_hat = (x - mean) * rstd
        g = torch.addcmul(shift_j, w2, x_hat)
        mix = (g * x_hat).mean(-1, keepdim=True)
        # d l / d(k W + h) = (g - mean(g) - x_hat mean(g x_hat)) / sigma
        G = torch.addcmul(g - g.mean(-1, keepdim=True), x_hat, mix, value=-1) * rstd
        grads.append(G)
        W = torch.baddbmm(W, kT_j, G, alpha=-1)
        h = torch.baddbmm(h, rate_j, G, alpha=-1)
    reads, Gs = (torch.stack(x, 1).unflatten(0, (B, H)) for x in (reads, grads))
    A = torch.tril(q @ k.transpose(-1, -2) + 1)  # [B, H, n, b, b]
    z = reads - eta * (A @ Gs)
    W, h = W.unflatten(0, (B, H)), h.unflatten(0, (B, H))
    return z.flatten(2, 3)[:, :, :T], W, h


def _fused(mode: str, *tensors: Tensor | None) -> bool:
    """Whether the fused kernels serve the call: the dual form on float32 CPU tensors, the
    kernels loaded, eager (a trace holds the PyTorch ops)."""
    present = [x for x in tensors if x is not None]
    return (
        mode == "chunk"
        and all(x.dtype == torch.float32 and x.device.type == "cpu" for x in present)
        and _native.applies(present[0])
        and not tracing(present[0])
    )


# The forward keeps the state entering every ``saved_every(b)``-th mini-batch, about one per
# SAVED_TOKENS tokens (as the chunk form keeps one per chunk of 64), and the backward recomputes
# those between: a state per mini-batch of a few tokens would be D / b times the size of q.
SAVED_TOKENS = 64


def saved_every(size: int) -> int:
    """Mini-batches (or chunks) of ``size`` tokens per state the fused forward keeps."""
    return max(1, SAVED_TOKENS // size)


def _rows(x: Tensor) -> Tensor:
    """x with unit stride along its last dimension (how the kernels read rows), else a copy of
    its distinct rows: a broadcast one (``o.sum()``'s gradient, every stride 0) is copied along
    its stride-0 dimensions once and expanded again (the kernels read rows at any stride, 0 too)."""
    if x.shape[-1] <= 1 or x.stride(-1) == 1:
        return x
    distinct = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.stride()[:-1])
    return x[distinct].contiguous().expand(x.shape)


class _FusedTTT(torch.autograd.Function):
    """The dual form on the compiled kernels (``csrc/ttt.cpp``: its header gives the forward's
    steps 1-6 and the backward's steps 7-11): q, k, v [B, T, H, D], w, b [H, D], eta
    [B, T, H, 1], W0 [B, H, D, D], h0 [B, H, 1, D] -> (o [B, T, H, D], W, h). The forward keeps
    the state entering every ``saved_every(b)``-th mini-batch and z; the backward's reverse loop
    recomputes the states between."""

    @staticmethod
    def forward(ctx, q, k, v, w, b, eta, W0, h0, scale: float, eps: float, size: int):
        o, z, W, h, Ws, hs = _native.kernel("ttt_forward")(
            q, k, v, eta[..., 0], w, b, W0, h0[:, :, 0], scale, eps, size, saved_every(size), True
        )
        ctx.save_for_backward(q, k, v, w, b, eta, z, Ws, hs)
        ctx.options = (scale, eps, size)
        return o, W, h.unsqueeze(2)

    @staticmethod
    def backward(ctx, d_o, dW, dh):
        q, k, v, w, b, eta, z, Ws, hs = ctx.saved_tensors
        scale, eps, size = ctx.options
        if d_o is None:
            d_o = torch.zeros_like(z)
        dW = None if dW is None else dW.contiguous()
        dh = None if dh is None else dh[:, :, 0].contiguous()
        dq, dk, dv, deta, dw, db, dW0, dh0 = _native.kernel("ttt_backward")(
            *(q, k, v, eta[..., 0], w, b, Ws, hs, z, _rows(d_o), dW, dh),
            *(scale, eps, size, saved_every(size)),
        )
        return dq, dk, dv, dw, db, deta.unsqueeze(-1), dW0, dh0.unsqueeze(2), None, None, None


def _fused_sequence(q, k, v, w, b, eta, W0, h0, scale: float, eps: float, size: int):
    """One sequence (or a batch of equal ones) on the kernels: (o [B, T, H, D], W, h)."""
    q, k, v = (_rows(x) for x in (q, k, v))
    w, b, W0, h0 = (x.contiguous() for x in (w, b, W0, h0))
    inputs = (q, k, v, w, b, eta, W0, h0)
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _FusedTTT.apply(*inputs, scale, eps, size)
    o, _, W, h, _, _ = _native.kernel("ttt_forward")(
        q, k, v, eta[..., 0], w, b, W0, h0[:, :, 0], scale, eps, size, 1, False
    )
    return o, W, h.unsqueeze(2)


def ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    b: Tensor,
    eta: Tensor,
    *,
    scale: float | None = None,
    eps: float = 1e-6,
    mini_batch_size: int = 16,
    mode: str = "chunk",
    initial_state: TTTState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, TTTState | None]:
    """TTT-Linear (Sun et al. 2024, sections 2.1-2.7): ``o_t = z_t + LN_{w,b}(z_t)``,
    ``z_t = (scale q_t) W_t + h_t``, ``W_t = W_0 - eta_t sum_{s <= t} grad_W l_s(W_0, h_0)`` in
    each mini-batch (the module docstring; oracle ``linattn.reference.ttt.ttt_linear``).

    Args:
        q, k, v: [B, T, H, D] (K = V = D). w, b: [H, D], the layer norm's weight and bias.
        eta: [B, T, H, 1] learning rates. scale: None is 1 / sqrt(D). eps: the layer norm's.
        mini_batch_size: tokens per gradient step (>= 1), from each sequence's start.
        mode: "recurrent" (the primal form) or "chunk" (the dual form).
        initial_state: None or (W [N, H, D, D], h [N, H, 1, D]).
        cu_seqlens: packed sequences (B = 1), N of them.

    Returns:
        (o [B, T, H, D] in q's dtype, (W, h) in the compute dtype or None).
    """
    B, T, H, K, V = checks.qkv(q, k, v)
    if K != V:
        raise ValueError(f"v must have the keys' width (TTT's target is v - k): K = {K}, V = {V}")
    for name, x in (("w", w), ("b", b)):
        checks.tensor(name, x, 2)
        if tuple(x.shape) != (H, V):
            raise ValueError(f"{name} must have shape [H, V] = {(H, V)}, got {tuple(x.shape)}")
    checks.tensor("eta", eta, 4)
    if tuple(eta.shape) != (B, T, H, 1):
        raise ValueError(
            f"eta must have shape [B, T, H, 1] = {(B, T, H, 1)}, got {tuple(eta.shape)}"
        )
    checks.scale(scale)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    size = checks.integer("mini_batch_size", mini_batch_size)
    if size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {size}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    output_final_state = checks.flag("output_final_state", output_final_state)
    N = checks.seqlens(cu_seqlens, B, T)
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise ValueError("initial_state must be None or a tuple (W, h)")
        parts = zip(("initial_state[0] (W)", "initial_state[1] (h)"), initial_state, strict=True)
        for (name, x), shape in zip(parts, ((N, H, K, V), (N, H, 1, V)), strict=True):
            checks.tensor(name, x, 4)
            if tuple(x.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if _backends.wanted(q):  # w is the layer norm's, no gate; the op's arguments by name
        chosen = _backends.choose("ttt_linear", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)

    in_dtype, dtype = q.dtype, compute_dtype(q.dtype)
    scale = K**-0.5 if scale is None else float(scale)
    state = () if initial_state is None else tuple(initial_state)
    if _fused(mode, q, k, v, w, b, eta, *state):
        if initial_state is None:
            W0, h0 = q.new_zeros(N, H, K, V), q.new_zeros(N, H, 1, V)
        else:
            W0, h0 = state
        if cu_seqlens is None:
            o, W, h = _fused_sequence(q, k, v, w, b, eta, W0, h0, scale, float(eps), size)
        else:
            bounds = cu_seqlens.tolist()
            parts = []
            for n, (a, c) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                rows = (x[:, a:c] for x in (q, k, v))
                state_n = (W0[n : n + 1], h0[n : n + 1])
                args = (*rows, w, b, eta[:, a:c], *state_n, scale, float(eps), size)
                parts.append(_fused_sequence(*args))
            o = torch.cat([p[0] for p in parts], dim=1)
            W, h = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
        return o, ((W, h) if output_final_state else None)
    q, k, v, eta = (x.to(dtype).transpose(1, 2) for x in (q, k, v, eta))  # [B, H, T, D]
    q = q * scale
    w, b = (x.to(dtype)[None, :, None, :] for x in (w, b))  # [1, H, 1, V]
    if initial_state is None:
        W0 = q.new_zeros(N, H, K, V)
        h0 = q.new_zeros(N, H, 1, V)
    else:
        W0, h0 = (x.to(dtype) for x in initial_state)
    if cu_seqlens is None:
        z, W, h = _sequence(q, k, v, eta, w, b, W0, h0, float(eps), size, mode)
    else:
        bounds = cu_seqlens.tolist()
        parts, states = [], []
        for n, (a, c) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            z_n, W_n, h_n = _sequence(
                *(x[:, :, a:c] for x in (q, k, v, eta)), w, b, W0[n : n + 1], h0[n : n + 1],
                float(eps), size, mode,
            )  # fmt: skip
            parts.append(z_n)
            states.append((W_n, h_n))
        z = torch.cat(parts, dim=2)
        W = torch.cat([s[0] for s in states])
        h = torch.cat([s[1] for s in states])
    o = (z + layer_norm(z, w, b, float(eps))).transpose(1, 2).to(in_dtype)
    return o, ((W, h) if output_final_state else None)
