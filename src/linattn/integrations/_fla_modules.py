"""CPU versions of the Triton-only functions of fla 0.6.0's modules that its models reach.

Used by ``linattn.integrations.fla.enable()`` (which rebinds fla's names to them for CPU
tensors): the rotary embedding (``fla.modules.rotary``: RetNet, ABC, CAT, DeltaFormer, MoBA,
NSA, Parallax, ...), the gated norm of ``fla.modules.norm.layernorm_gated`` (``RMSNormGated``:
Mamba-2), the quantised norm + linear of ``fla.modules.fused_bitlinear`` (``FusedBitLinear``:
BitNet), the additive gate of ``fla.ops.gsa.gate`` (GSA, LightNet's gate path) and the KDA gate
of ``fla.ops.kda.gate`` (``fused_kda_gate``: PrecondKDA). PyTorch, autograd gives the backward
(or fla's own autograd function around the replaced function); the formulas are those of fla's
kernels and reference functions, computed in float32 for half-precision inputs as fla's kernels
do (float64 stays float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linattn.dtypes import compute_dtype
from linattn.ops.functional import decay_gate

# ------------------------------------------------------------------------------- rotary


def rotary_embedding_fwdbwd(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    interleaved: bool = False,
    inplace: bool = False,
    conjugate: bool = False,
    chunk_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """fla's rotary embedding (RoFormer, Su et al. 2021) of x [B, T, H, D], or its conjugate.

    Position ``p = t + offset`` (t counted from each sequence's start with ``cu_seqlens``;
    ``seqlen_offsets`` an int or one per sequence [N]); the first ``2R`` channels (R = cos's
    last dimension) turn by the angle of row p of the cos / sin cache [TR, R]: pairs
    ``(x_i, x_{i+R})`` (or ``(x_{2i}, x_{2i+1})`` with ``interleaved``) become
    ``(x_i cos - x_{i+R} sin, x_i sin + x_{i+R} cos)``; ``conjugate`` turns by ``-sin`` (the
    backward). Channels past 2R are copied; a row whose p is outside ``[0, TR)`` (left padding)
    is zero in the turned channels, as fla's kernel leaves it. With ``inplace`` x is written
    and returned. ``chunk_indices`` (fla's tiling) is ignored.
    """
    B, T, H, D = x.shape
    TR, R = cos.shape
    if 2 * R > D:
        raise ValueError(f"rotary dimension 2 * {R} exceeds the head dimension {D}")
    if cu_seqlens is None:
        t = torch.arange(T, device=x.device).expand(B, T)
        seq = torch.arange(B, device=x.device)[:, None].expand(B, T)
    else:
        if B != 1:
            raise ValueError("cu_seqlens: x must have batch size 1")
        bounds = cu_seqlens.to(device=x.device, dtype=torch.long)
        lengths = bounds[1:] - bounds[:-1]
        seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths)
        t = (torch.arange(T, device=x.device) - bounds[seq])[None]
        seq = seq[None]
    offset = seqlen_offsets[seq].to(t.dtype) if torch.is_tensor(seqlen_offsets) else seqlen_offsets
    p = t + offset  # [B, T]
    valid = (p >= 0) & (p < TR)
    p = p.clamp(0, TR - 1)
    dtype = compute_dtype(x.dtype)
    c = cos.to(dtype)[p].unsqueeze(2)  # [B, T, 1, R]
    s = sin.to(dtype)[p].unsqueeze(2)
    if conjugate:
        s = -s
    xr = x[..., : 2 * R].to(dtype)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        turned = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., :R], xr[..., R:]
        turned = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    turned = turned * valid[..., None, None].to(dtype)
    y = torch.cat((turned.to(x.dtype), x[..., 2 * R :]), dim=-1)
    if inplace:
        return x.copy_(y)
    return y


# ------------------------------------------------------------------------------- gated norm


def layernorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = False,
) -> torch.Tensor:
    """fla's gated (group) norm of ``fla.modules.norm.layernorm_gated`` (Mamba-2's
    ``RMSNormGated``, ``LayerNormGated``).

    Over each group of ``group_size`` channels (all of them when None):
    ``y = norm(h) * weight + bias`` with ``norm(h) = (h - mean) / sqrt(var + eps)`` (or
    ``h / sqrt(mean(h^2) + eps)`` with ``is_rms_norm``) and ``h = x``; the gate ``silu(z)``
    multiplies y (``norm_before_gate``) or x before the norm (``h = x silu(z)``). y in x's dtype.
    """
    D = x.shape[-1]
    group = D if group_size is None else group_size
    if D % group:
        raise ValueError(f"group_size ({group}) must divide the last dimension {D}")
    dtype = compute_dtype(x.dtype)
    h = x.to(dtype)
    gate = None if z is None else F.silu(z.to(dtype))
    if gate is not None and not norm_before_gate:
        h = h * gate
    hg = h.unflatten(-1, (D // group, group))
    if not is_rms_norm:
        hg = hg - hg.mean(-1, keepdim=True)
    y = (hg * torch.rsqrt(hg.square().mean(-1, keepdim=True) + eps)).flatten(-2)
    y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype)


def rmsnorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """fla's ``rmsnorm_fn`` (``RMSNormGated``): ``layernorm_fn`` with ``is_rms_norm``."""
    return layernorm_fn(x, weight, bias, z, eps, group_size, norm_before_gate, True)


# ------------------------------------------------------------------------------- BitNet


def weight_quant(w: torch.Tensor) -> torch.Tensor:
    """BitNet b1.58's ternary weights (Ma et al. 2024): ``round(w / s).clamp(-1, 1) s`` with
    ``s = max(mean|w|, 1e-5)`` over the whole tensor (ties to even, as torch's round)."""
    scale = w.abs().mean().clamp(min=1e-5)
    return (w / scale).round().clamp(-1, 1) * scale


def activation_quant(y: torch.Tensor) -> torch.Tensor:
    """BitNet's 8-bit activations per token: ``q = round(y s).clamp(-128, 127) / s`` with
    ``s = 127 / max(max|y|, 1e-5)`` over the last dimension, rounding halves away from zero as
    fla's kernel does."""
    scale = 127.0 / y.abs().amax(-1, keepdim=True).clamp(min=1e-5)
    scaled = y * scale
    rounded = torch.where(scaled >= 0, torch.floor(scaled + 0.5), torch.ceil(scaled - 0.5))
    return rounded.clamp(-128, 127) / scale


def layer_norm_linear_quant(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    linear_weight: torch.Tensor,
    linear_bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    is_rms_norm: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """fla's ``layer_norm_linear_quant`` (``FusedBitLinear``, BitNet b1.58).

    ``h = x + residual``; ``y = activation_quant(norm(h) * norm_weight + norm_bias)`` (layer or
    RMS norm over the last dimension, in float32); ``out = linear(y, weight_quant(W), b)`` in
    y's dtype. Both quantisations are straight-through (their gradient is the identity), as
    fla's backward. With prenorm also h (residual's dtype, float32 with residual_in_fp32).
    """
    dtype = compute_dtype(x.dtype)
    h = x.to(dtype)
    if residual is not None:
        h = h + residual.to(dtype)
    centred = h if is_rms_norm else h - h.mean(-1, keepdim=True)
    y = centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps)
    if norm_weight is not None:
        y = y * norm_weight.to(dtype)
    if norm_bias is not None:
        y = y + norm_bias.to(dtype)
    y = (y + (activation_quant(y) - y).detach()).to(x.dtype)
    w = linear_weight.to(y.dtype)
    w = w + (weight_quant(w) - w).detach()
    out = F.linear(y, w, None if linear_bias is None else linear_bias.to(y.dtype))
    if not prenorm:
        return out
    residual_dtype = residual.dtype if residual is not None else None
    if residual_dtype is None:
        residual_dtype = torch.float32 if residual_in_fp32 else x.dtype
    return out, h.to(residual_dtype)


# ------------------------------------------------------------------------------- GSA's gate


def fused_additive_gate(
    x: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    gate_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fla's ``fused_additive_gate`` (gated slot attention's slot gate, Zhang et al. 2024).

    Per channel, the running log-normaliser ``z_t = logaddexp(z_{t-1}, x_t)`` from
    ``z_{-1}`` = initial_state (else -inf); returns ``k_t = exp(x_t - z_t)``, the log-decay
    ``g_t = z_{t-1} - z_t`` (0 where ``z_{-1} = -inf``) and the final ``z`` [N, 1, H, K] in
    float32 (a sequence of length 0 keeps its initial state, or -inf). x [B, T, H, K]; with
    ``cu_seqlens`` B = 1 and one state per sequence.
    """
    if cu_seqlens is not None and x.shape[0] != 1:
        raise ValueError("fused_additive_gate: x with cu_seqlens must have batch size 1")
    N = x.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None and initial_state.shape != (N, 1, *x.shape[2:]):
        want, got = (N, 1, *x.shape[2:]), tuple(initial_state.shape)
        raise ValueError(f"initial_state must have shape {want}, got {got}")
    dtype = compute_dtype(x.dtype)
    if cu_seqlens is None:
        pieces = [(x.to(dtype), initial_state)]
    else:
        bounds = cu_seqlens.tolist()
        pieces = [
            (
                x[:, a:b].to(dtype),
                None if initial_state is None else initial_state[n : n + 1],
            )
            for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
    ks, gs, finals = [], [], []
    for xs, z0 in pieces:
        start = xs.new_full((xs.shape[0], 1, *xs.shape[2:]), -torch.inf) if z0 is None else z0
        start = start.to(dtype)
        if xs.shape[1] == 0:
            ks.append(xs)
            gs.append(xs)
            finals.append(start)
            continue
        z = torch.logaddexp(torch.logcumsumexp(xs, dim=1), start)
        before = torch.cat((start, z[:, :-1]), dim=1)
        known = ~torch.isneginf(before)
        g = torch.where(known, before.where(known, 0.0) - z, 0.0)
        ks.append(torch.exp(xs - z))
        gs.append(g)
        finals.append(z[:, -1:])
    k = torch.cat(ks, dim=1).to(output_dtype or x.dtype)
    g = torch.cat(gs, dim=1).to(gate_dtype or x.dtype)
    final = torch.cat(finals, dim=0).to(torch.float32 if dtype == torch.float32 else dtype)
    return k, g, final


# ------------------------------------------------------------------------------- KDA's gate


def fused_kda_gate(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """fla's ``fused_kda_gate`` (Kimi Delta Attention's log-decay, per key channel).

    ``g' = -exp(A_log) softplus(g + dt_bias)`` (spec section 10); with ``lower_bound``:
    ``g' = lower_bound * sigmoid(exp(A_log) (g + dt_bias))`` (without A_log:
    ``lower_bound * sigmoid(g + dt_bias)``). g [..., H, K], A_log [H], dt_bias [H K]; computed
    in float32 (float64 stays), returned in ``output_dtype``.
    """
    H, K = g.shape[-2:]
    dtype = compute_dtype(g.dtype)
    x = g.to(dtype)
    bias = None if dt_bias is None else dt_bias.to(dtype).view(H, K)
    a = None if A_log is None else A_log.to(dtype).view(H, 1)
    if lower_bound is None:
        if a is None:
            raise ValueError("fused_kda_gate: A_log is required without lower_bound")
        y = decay_gate(x, a, bias)
    else:
        if bias is not None:
            x = x + bias
        if a is not None:
            x = torch.exp(a) * x
        y = lower_bound * torch.sigmoid(x)
    return y.to(output_dtype)


def kda_gate_fwd(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """fla's ``kda_gate_fwd``: ``fused_kda_gate`` without gradient."""
    with torch.no_grad():
        return fused_kda_gate(g, A_log, dt_bias, lower_bound, output_dtype)


def kda_gate_bwd(
    g: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dyg: torch.Tensor | None = None,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """fla's ``kda_gate_bwd``: the gradients (dg in g's dtype, dA_log and ddt_bias in theirs) of
    ``fused_kda_gate`` for the output gradient ``dyg``, by autograd."""
    with torch.enable_grad():
        inputs = [g.detach().to(compute_dtype(g.dtype)).requires_grad_()]
        for p in (A_log, dt_bias):
            if p is not None:
                inputs.append(p.detach().to(compute_dtype(p.dtype)).requires_grad_())
        it = iter(inputs[1:])
        a = next(it) if A_log is not None else None
        b = next(it) if dt_bias is not None else None
        y = fused_kda_gate(inputs[0], a, b, lower_bound, inputs[0].dtype)
        grads = torch.autograd.grad(y, inputs, dyg.to(y.dtype))
    dg = grads[0].to(g.dtype)
    rest = iter(grads[1:])
    dA = next(rest).to(A_log.dtype) if A_log is not None else None
    dbias = next(rest).to(dt_bias.dtype) if dt_bias is not None else None
    return dg, dA, dbias
