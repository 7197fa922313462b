"""fla 0.6.0's layers and models on the CPU: ``enable()``, ``disable()``, ``is_enabled()``.

flash-linear-attention (``fla.layers``, ``fla.models``) runs its ops and several modules as Triton
kernels only; on the CPU they stop at the first launch ("0 active drivers"). ``enable()`` puts
CPU implementations behind the names fla's code calls, in fla's own modules:

- the ops (``chunk_gated_delta_rule``, ``fused_recurrent_kda``, ...): fla's layers import them by
  name (``from fla.ops.gated_delta_rule import chunk_gated_delta_rule``), so every loaded ``fla``
  module whose global is fla's function gets ``linattn.compat``'s (fla's op interface, same
  positional order, keywords and return structure) in its place;
- the functions behind fla's Triton-only modules, rebound the same way: ``causal_conv1d`` and
  ``causal_conv1d_update`` (``ShortConvolution`` and its cache), ``rms_norm`` / ``layer_norm``
  (``RMSNorm``, ``LayerNorm``, the fused residual pre-norm of fla's blocks), ``rms_norm_linear``
  (the GSA layer's output norm and projection), ``group_norm``
  (``GroupNorm``), ``rms_norm_gated`` / ``layer_norm_gated`` (``FusedRMSNormGated`` and the
  other gated norms), ``l2norm``, ``swiglu`` and ``swiglu_linear`` (``GatedMLP``), ``swish_fwd``
  and ``swish_bwd`` (``swish``, the autograd function behind ``ACT2FN["swish"]``), likewise
  ``sigmoid_fwd`` / ``sigmoid_bwd``, ``logsigmoid_fwd`` / ``logsigmoid_bwd`` and ``elu_p1_fwd`` /
  ``elu_p1_bwd`` (``elu_p1``, the feature map of DeltaNet and LinearAttention), and the
  RWKV-6 / RWKV-7 ones (``linattn.integrations._fla_rwkv``): ``token_shift`` (time mixing,
  ``LerpLinear``, ``DDLerpLinear``, the models' channel mixing), ``fused_addcmul_rwkv7``,
  ``fused_k_rwkv7`` and ``gate_output_correction``; the norm + linear pairs ``layer_norm_linear``
  (``rms_norm_linear``, ``group_norm_linear``: HGRN2's and GSA's output) and
  ``rms_norm_swish_gate_linear`` / ``layer_norm_swish_gate_linear`` (LightNet's output); and
  (``linattn.integrations._fla_modules``) the rotary embedding ``rotary_embedding_fwdbwd``
  (``RotaryEmbedding``, ``rotary_embedding``: RetNet, ABC, CAT, DeltaFormer, MoBA, NSA, Parallax,
  YOCO, ...), ``layernorm_fn`` / ``rmsnorm_fn`` of ``fla.modules.norm.layernorm_gated``
  (``RMSNormGated``, ``LayerNormGated``: Mamba-2), BitNet's ``layer_norm_linear_quant``
  (``FusedBitLinear``, ``bit_linear``), GSA's additive gate ``fused_additive_gate`` (GSA, LightNet)
  and KDA's gate ``fused_kda_gate``, ``kda_gate_fwd`` and ``kda_gate_bwd`` (PrecondKDA);
  and (``linattn.integrations._fla_parallax``) Parallax's cached attention ``parallax_decode``
  and ``parallax_decode_one_step`` (the Parallax layer's prefill with a cache and decoding);
- the losses, whose ``forward`` itself refuses CPU tensors: ``FusedCrossEntropyLoss.forward`` and
  ``FusedLinearCrossEntropyLoss.forward`` are replaced on the class.

The CPU implementations are PyTorch (autograd gives the backward) with the formulas of fla's
kernels and reference code, computed in float32 for half-precision inputs as fla's kernels do.

Dispatch: only CPU tensors go to linattn; a tensor on any other device (CUDA) keeps fla's own
kernel, so ``enable()`` is safe on a machine with a GPU. ``disable()`` puts back exactly the
objects fla had bound (identity). fla modules imported after ``enable()`` keep fla's bindings.
fla itself is imported only by ``enable()`` (the ``linattn[integrations]`` extra).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from linattn.dtypes import compute_dtype
from linattn.integrations import (
    _fla_attention,
    _fla_log_linear,
    _fla_modules,
    _fla_parallax,
    _fla_rwkv,
)
from linattn.ops.functional import causal_conv1d as shared_conv1d
from linattn.ops.functional import conv_activation
from linattn.ops.functional import l2norm as shared_l2norm

EXTRA = 'pip install "linattn[integrations]"'

# (namespace, attribute, what fla had bound): every rebinding enable() made, for disable().
_saved: list[tuple[object, str, object]] = []


def _import_fla():
    """fla's op, module, layer and model packages (importing them loads every fla module)."""
    try:
        importlib.import_module("fla")
    except ImportError as error:
        raise ImportError(
            f"linattn.integrations.fla needs flash-linear-attention (fla 0.6.0): {EXTRA}"
        ) from error
    for name in ("fla.ops", "fla.modules", "fla.layers", "fla.models"):
        importlib.import_module(name)
    return sys.modules["fla"]


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of the first tensor argument (positional, then keyword), or None."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _on_cpu(original: Callable, cpu: Callable) -> Callable:
    """A function calling cpu for CPU tensors and fla's original for any other device."""

    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        device = _device_of(args, kwargs)
        if device is None or device.type == "cpu":
            return cpu(*args, **kwargs)
        return original(*args, **kwargs)

    dispatch.linattn_cpu = cpu
    return dispatch


# ---------------------------------------------------------------- short convolution (causal_conv1d)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context: object | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's depthwise causal convolution: ``y_t = act(sum_j w_j x_{t-W+1+j} + b) + residual_t``.

    x [B, T, D] (or [B, T, ...] flattened to D), weight [D, W], states [N, D, W]: the last W
    inputs of ``cat(initial_state, x)`` along time (the oldest slot is not read by the next
    call, as in fla). ``cu_seqlens``: B = 1 and one state per sequence. ``backend`` is ignored.
    """
    if cp_context is not None:
        raise NotImplementedError("causal_conv1d: cp_context (context parallel) is not supported")
    shape = x.shape
    if weight is not None and x.shape[-1] != weight.shape[0]:
        x = x.flatten(2)  # [B, T, ...] -> [B, T, D]
    if cu_seqlens is None:
        y, final = _conv(x, weight, bias, initial_state, activation)
    else:
        bounds = cu_seqlens.tolist()
        parts = [
            _conv(
                x[:, a:b],
                weight,
                bias,
                None if initial_state is None else initial_state[n : n + 1],
                activation,
            )
            for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
        y = torch.cat([p[0] for p in parts], dim=1)
        final = torch.cat([p[1] for p in parts], dim=0)
    if residual is not None:
        y = y + residual.reshape(y.shape)
    return y.contiguous().view(shape), (final if output_final_state else None)


def _conv(x, weight, bias, initial_state, activation):
    """One batch of sequences: x [B, T, D] -> y [B, T, D] (x's dtype), final state [B, D, W]."""
    B, T, D = x.shape
    W = weight.shape[1] if weight is not None else initial_state.shape[-1]
    dtype = compute_dtype(x.dtype)
    past = x.new_zeros(B, D, W) if initial_state is None else initial_state.to(x.dtype)
    xt = x.transpose(1, 2)  # [B, T, D] -> [B, D, T]
    final = torch.cat([past, xt], dim=-1)[..., -W:].contiguous()  # [B, D, W], in x's dtype
    w = (weight if weight is not None else x.new_ones(D, W)).to(dtype)
    b = None if bias is None else bias.to(dtype)
    y, _ = shared_conv1d(xt.to(dtype), w, b, past[..., 1:].to(dtype))  # the oldest slot unread
    y = conv_activation(y.transpose(1, 2), activation)  # [B, D, T] -> [B, T, D]
    return y.to(x.dtype), final


def causal_conv1d_update(
    x: torch.Tensor,
    cache: torch.Tensor,
    residual: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of ``causal_conv1d``; updates ``cache`` [N, D, W] in place, as fla's.

    The cache shifts one slot left and takes x in its last; ``y = act(sum_j w_j cache_j + b)``
    (+ residual). x is [N, D], [1, N, D] or [N, 1, D] (one token per sequence). The sum of
    products, then the bias, as fla's kernel (``linattn.ops.functional.causal_conv1d``'s
    conv1d rounds differently in float32).
    """
    shape = x.shape
    D = cache.shape[1]
    dtype = compute_dtype(x.dtype)
    rows = x.reshape(-1, D)  # [N, D]
    cache.copy_(torch.cat([cache[..., 1:], rows.unsqueeze(-1).to(cache.dtype)], dim=-1))
    w = weight.to(dtype) if weight is not None else cache.new_ones(D, cache.shape[-1], dtype=dtype)
    y = (cache.to(dtype) * w).sum(-1)  # [N, D]
    if bias is not None:
        y = y + bias.to(dtype)
    y = conv_activation(y, activation)
    if residual is not None:
        y = y + residual.reshape(y.shape).to(dtype)
    return y.to(x.dtype).view(shape), cache


# ------------------------------------------------------------------------------- norms


def _norm(
    x, g, weight, bias, residual, eps, prenorm, residual_in_fp32, is_rms, activation, groups=1
):
    """fla's (gated) layer / RMS / group norm with the fused residual of its pre-norm blocks.

    ``h = x + residual``; ``y = norm(h) * weight + bias`` with ``norm(h) = h / sqrt(mean(h^2)
    + eps)`` (RMS) or ``(h - mean) / sqrt(var + eps)``, the mean and variance over each of
    ``groups`` equal slices of the last dimension (1: all of it); gated: ``y * silu(g)``
    ('swish') or ``y * sigmoid(g)``; y in x's dtype. With prenorm also h (residual's dtype,
    float32 with residual_in_fp32, else x's; x itself when neither changes it), as fla returns.
    """
    dtype = compute_dtype(x.dtype)
    h = x.to(dtype)
    if residual is not None:
        h = h + residual.to(dtype)
    residual_dtype = residual.dtype if residual is not None else None
    if residual_dtype is None and residual_in_fp32:
        residual_dtype = torch.float32
    if residual_dtype is None or (residual is None and residual_dtype == x.dtype):
        residual_out = x
    else:
        residual_out = h.to(residual_dtype)
    if h.shape[-1] % groups:
        raise ValueError(f"num_groups ({groups}) must divide the last dimension {h.shape[-1]}")
    hg = h.unflatten(-1, (groups, -1))  # [..., D] -> [..., groups, D / groups]
    centred = hg if is_rms else hg - hg.mean(-1, keepdim=True)
    y = (centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps)).flatten(-2)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    if g is not None:
        gate = g.to(dtype)
        if activation in ("swish", "silu"):
            y = y * F.silu(gate)
        elif activation == "sigmoid":
            y = y * torch.sigmoid(gate)
        else:
            raise ValueError(f"activation must be 'swish', 'silu' or 'sigmoid', got {activation!r}")
    y = y.to(x.dtype)
    return (y, residual_out) if prenorm else y


def rms_norm(x, weight, bias, residual=None, eps=1e-5, prenorm=False, residual_in_fp32=False):
    """fla's ``rms_norm`` (``RMSNorm``): see ``_norm``."""
    return _norm(x, None, weight, bias, residual, eps, prenorm, residual_in_fp32, True, None)


def group_norm(
    x,
    weight,
    bias,
    residual=None,
    eps=1e-5,
    prenorm=False,
    residual_in_fp32=False,
    is_rms_norm=False,
    num_groups=1,
):
    """fla's ``group_norm`` (``GroupNorm``: RWKV-6's and RWKV-7's per-head output norm) and,
    with its default ``num_groups=1``, ``layer_norm`` (``LayerNorm``; fla's signature is this one
    without ``num_groups``): see ``_norm``."""
    return _norm(
        x,
        None,
        weight,
        bias,
        residual,
        eps,
        prenorm,
        residual_in_fp32,
        is_rms_norm,
        None,
        num_groups,
    )


def rms_norm_gated(
    x,
    g,
    weight,
    bias,
    activation="swish",
    residual=None,
    prenorm=False,
    residual_in_fp32=False,
    eps=1e-6,
):
    """fla's ``rms_norm_gated`` (``FusedRMSNormGated``, ``FusedRMSNormSwishGate``)."""
    return _norm(x, g, weight, bias, residual, eps, prenorm, residual_in_fp32, True, activation)


def layer_norm_gated(
    x,
    g,
    weight,
    bias,
    activation="swish",
    residual=None,
    prenorm=False,
    residual_in_fp32=False,
    eps=1e-6,
):
    """fla's ``layer_norm_gated`` (``FusedLayerNormGated``, ``FusedLayerNormSwishGate``)."""
    return _norm(x, g, weight, bias, residual, eps, prenorm, residual_in_fp32, False, activation)


def layer_norm_linear(
    x,
    norm_weight,
    norm_bias,
    linear_weight,
    linear_bias,
    residual=None,
    eps=1e-5,
    prenorm=False,
    residual_in_fp32=False,
    is_rms_norm=False,
    num_groups=1,
):
    """fla's ``layer_norm_linear`` (and so ``rms_norm_linear``, ``group_norm_linear``: HGRN2's
    and GSA's output): ``linear(norm(x + residual))``, the norm as ``group_norm``'s, the linear
    in the norm's output dtype; with prenorm also the residual stream."""
    y = _norm(
        x,
        None,
        norm_weight,
        norm_bias,
        residual,
        eps,
        prenorm,
        residual_in_fp32,
        is_rms_norm,
        None,
        num_groups,
    )
    y, residual_out = y if prenorm else (y, None)
    bias = None if linear_bias is None else linear_bias.to(y.dtype)
    out = F.linear(y, linear_weight.to(y.dtype), bias)
    return (out, residual_out) if prenorm else out


def _gated_linear(is_rms_norm: bool):
    def gated_linear(
        x,
        g,
        norm_weight,
        norm_bias,
        linear_weight,
        linear_bias,
        residual=None,
        prenorm=False,
        residual_in_fp32=False,
        eps=1e-6,
    ):
        y = _norm(
            x,
            g,
            norm_weight,
            norm_bias,
            residual,
            eps,
            prenorm,
            residual_in_fp32,
            is_rms_norm,
            "swish",
        )
        y, residual_out = y if prenorm else (y, None)
        bias = None if linear_bias is None else linear_bias.to(y.dtype)
        out = F.linear(y, linear_weight.to(y.dtype), bias)
        return (out, residual_out) if prenorm else out

    kind = "rms" if is_rms_norm else "layer"
    gated_linear.__name__ = f"{kind}_norm_swish_gate_linear"
    gated_linear.__doc__ = (
        f"fla's ``{kind}_norm_swish_gate_linear`` (LightNet's output): "
        "``linear(norm(x + residual) * weight + bias) * silu(g))``, the norm as "
        f"``{kind}_norm_gated``'s; with prenorm also the residual stream."
    )
    return gated_linear


rms_norm_swish_gate_linear = _gated_linear(True)
layer_norm_swish_gate_linear = _gated_linear(False)


def l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: torch.dtype | None = None):
    """fla's ``l2norm``: ``x / sqrt(sum(x^2) + eps)`` over the last dimension, computed in
    float32 (float64 stays), returned in x's dtype or ``output_dtype``."""
    y = shared_l2norm(x.to(compute_dtype(x.dtype)), eps)
    return y.to(x.dtype if output_dtype is None else output_dtype)


# ------------------------------------------------------------------------------- SwiGLU


def swiglu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fla's ``swiglu``: ``silu(x) * y`` in x's dtype."""
    dtype = compute_dtype(x.dtype)
    return (F.silu(x.to(dtype)) * y.to(dtype)).to(x.dtype)


def swish_fwd(x: torch.Tensor, output_contiguous: bool = False) -> torch.Tensor:
    """fla's ``swish_fwd`` (``swish``, ``ACT2FN["swish"]``: RWKV-6's output gate):
    ``x sigmoid(x)`` in x's dtype."""
    return F.silu(x.to(compute_dtype(x.dtype))).to(x.dtype)


def swish_bwd(x: torch.Tensor, dy: torch.Tensor, output_contiguous: bool = False) -> torch.Tensor:
    """fla's ``swish_bwd``: ``dy s (1 + x (1 - s))`` with ``s = sigmoid(x)``, in x's dtype."""
    xf = x.to(compute_dtype(x.dtype))
    s = torch.sigmoid(xf)
    return (dy.to(xf.dtype) * s * (1 + xf * (1 - s))).to(x.dtype)


def sigmoid_fwd(x: torch.Tensor, output_contiguous: bool = False) -> torch.Tensor:
    """fla's ``sigmoid_fwd`` (``ACT2FN["sigmoid"]``): ``sigmoid(x)`` in x's dtype."""
    return torch.sigmoid(x.to(compute_dtype(x.dtype))).to(x.dtype)


def sigmoid_bwd(x: torch.Tensor, dy: torch.Tensor, output_contiguous: bool = False) -> torch.Tensor:
    """fla's ``sigmoid_bwd``: ``dy s (1 - s)`` with ``s = sigmoid(x)``, in x's dtype."""
    s = torch.sigmoid(x.to(compute_dtype(x.dtype)))
    return (dy.to(s.dtype) * s * (1 - s)).to(x.dtype)


def elu_p1_fwd(x: torch.Tensor) -> torch.Tensor:
    """fla's ``elu_p1_fwd`` (``elu_p1``: the linear-attention feature map of DeltaNet and
    LinearAttention): ``elu(x) + 1`` = ``x + 1`` for x >= 0, ``exp(x)`` below, in x's dtype."""
    xf = x.to(compute_dtype(x.dtype))
    return torch.where(xf >= 0, xf + 1, torch.exp(xf.clamp(max=0))).to(x.dtype)


def elu_p1_bwd(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """fla's ``elu_p1_bwd``: ``dy exp(min(x, 0))``, in x's dtype."""
    xf = x.to(compute_dtype(x.dtype))
    return (dy.to(xf.dtype) * torch.exp(xf.clamp(max=0))).to(x.dtype)


def logsigmoid_fwd(
    x: torch.Tensor, temperature: float = 1.0, output_contiguous: bool = False
) -> torch.Tensor:
    """fla's ``logsigmoid_fwd`` (``logsigmoid``, ``ACT2FN["logsigmoid"]``): ``log sigmoid(x) /
    temperature``, in x's dtype."""
    return (F.logsigmoid(x.to(compute_dtype(x.dtype))) / temperature).to(x.dtype)


def logsigmoid_bwd(
    x: torch.Tensor, dy: torch.Tensor, temperature: float = 1.0, output_contiguous: bool = False
) -> torch.Tensor:
    """fla's ``logsigmoid_bwd``: ``dy (1 - sigmoid(x)) / temperature``, in x's dtype."""
    xf = x.to(compute_dtype(x.dtype))
    return (dy.to(xf.dtype) * (1 - torch.sigmoid(xf)) / temperature).to(x.dtype)


def swiglu_linear(x, y, weight, bias):
    """fla's ``swiglu_linear`` (``GatedMLP`` with ``fuse_swiglu``): ``linear(silu(x) * y)``."""
    return F.linear(swiglu(x, y), weight, bias)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    logit_scale: float = 1.0,
    lse_square_scale: float = 0.0,
    logit_softcapping: float | None = None,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's unreduced cross entropy and z-loss, float32, [N] each (0 where ignored).

    ``z = c tanh(s logits / c)`` (c the softcap, else ``s logits``), ``lse = logsumexp(z)``,
    ``loss = lse - (1 - eps) z_target - eps mean(z) + lse_square_scale lse^2``; the z-loss term
    is returned alone too, without gradient.
    """
    z = logits.to(compute_dtype(logits.dtype)) * logit_scale
    if logit_softcapping is not None:
        z = logit_softcapping * torch.tanh(z / logit_softcapping)
    lse = torch.logsumexp(z, dim=-1)
    valid = target != ignore_index
    picked = z.gather(-1, target.where(valid, 0).unsqueeze(-1)).squeeze(-1)
    loss = lse - (1 - label_smoothing) * picked
    if label_smoothing > 0:
        loss = loss - label_smoothing * z.mean(-1)
    z_loss = lse_square_scale * lse.square()
    loss = (loss + z_loss).where(valid, 0.0)
    return loss, z_loss.where(valid, 0.0).detach()


def _cross_entropy_forward(self, input: torch.Tensor, target: torch.Tensor):
    """``FusedCrossEntropyLoss.forward`` on the CPU (fla's own asserts CUDA/NPU/XPU tensors)."""
    if self.process_group is not None:
        raise NotImplementedError("FusedCrossEntropyLoss on the CPU: process_group must be None")
    loss, z_loss = cross_entropy(
        input,
        target,
        self.label_smoothing,
        self.logit_scale,
        self.lse_square_scale,
        self.logit_softcapping,
        self.ignore_index,
    )
    if self.reduction != "none":
        loss, z_loss = loss.sum(), z_loss.sum()
        if self.reduction == "mean":
            total = (target != self.ignore_index).sum()
            loss, z_loss = loss / total, z_loss / total
    return (loss, z_loss) if self.return_z_loss else loss


def _linear_cross_entropy_forward(self, x, target, weight, bias=None):
    """``FusedLinearCrossEntropyLoss.forward`` on the CPU: ``linear(x)`` then cross entropy.

    The mean is over the targets that are not ignored; ``use_l2warp`` adds fla's ``l2_warp``
    (normalised by the number of tokens).
    """
    if self.process_group is not None:
        raise NotImplementedError(
            "FusedLinearCrossEntropyLoss on the CPU: process_group must be None"
        )
    from fla.modules.l2warp import l2_warp

    logits = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)  # [N, V]
    target = target.reshape(-1)
    loss, _ = cross_entropy(
        logits,
        target,
        self.label_smoothing,
        self.logit_scale,
        0.0,
        self.logit_softcapping,
        self.ignore_index,
    )
    loss = loss.sum()
    if self.reduction == "mean":
        loss = loss / (target != self.ignore_index).sum()
    if self.use_l2warp:
        loss = l2_warp(loss, logits.unsqueeze(0), self.l2_penalty_factor)
    return loss


def _method_on_cpu(original: Callable, cpu: Callable) -> Callable:
    """A method calling cpu when its first tensor argument is on the CPU, else the original."""

    @functools.wraps(original)
    def dispatch(self, *args, **kwargs):
        device = _device_of(args, kwargs)
        if device is None or device.type == "cpu":
            return cpu(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    dispatch.linattn_cpu = cpu
    return dispatch


# ------------------------------------------------------------------------------- enable / disable

# fla module -> the functions defined (or re-exported) there that linattn replaces on the CPU.
MODULE_FUNCTIONS: dict[str, dict[str, Callable]] = {
    "fla.modules.causal_conv1d.ops": {
        "causal_conv1d": causal_conv1d,
        "causal_conv1d_update": causal_conv1d_update,
    },
    "fla.modules.norm.layernorm": {
        "rms_norm": rms_norm,
        "layer_norm": group_norm,
        "group_norm": group_norm,
        "layer_norm_linear": layer_norm_linear,
    },
    "fla.modules.norm.fused_norm_gate": {
        "rms_norm_gated": rms_norm_gated,
        "layer_norm_gated": layer_norm_gated,
        "rms_norm_swish_gate_linear": rms_norm_swish_gate_linear,
        "layer_norm_swish_gate_linear": layer_norm_swish_gate_linear,
    },
    "fla.modules.norm.l2norm": {"l2norm": l2norm},
    # the modules fla's other model families reach
    "fla.modules.norm.layernorm_gated": {
        "layernorm_fn": _fla_modules.layernorm_fn,
        "rmsnorm_fn": _fla_modules.rmsnorm_fn,
    },
    "fla.modules.rotary.ops": {"rotary_embedding_fwdbwd": _fla_modules.rotary_embedding_fwdbwd},
    "fla.modules.fused_bitlinear": {
        "layer_norm_linear_quant": _fla_modules.layer_norm_linear_quant
    },
    "fla.ops.gsa.gate": {"fused_additive_gate": _fla_modules.fused_additive_gate},
    "fla.ops.kda.gate": {
        "fused_kda_gate": _fla_modules.fused_kda_gate,
        "kda_gate_fwd": _fla_modules.kda_gate_fwd,
        "kda_gate_bwd": _fla_modules.kda_gate_bwd,
    },
    "fla.modules.activations.ops": {
        "swiglu": swiglu,
        "swiglu_linear": swiglu_linear,
        "swish_fwd": swish_fwd,
        "swish_bwd": swish_bwd,
        "sigmoid_fwd": sigmoid_fwd,
        "sigmoid_bwd": sigmoid_bwd,
        "elu_p1_fwd": elu_p1_fwd,
        "elu_p1_bwd": elu_p1_bwd,
        "logsigmoid_fwd": logsigmoid_fwd,
        "logsigmoid_bwd": logsigmoid_bwd,
    },
    "fla.modules.token_shift": {"token_shift": _fla_rwkv.token_shift},
    "fla.ops.parallax.decode": {
        "parallax_decode": _fla_parallax.parallax_decode,
        "parallax_decode_one_step": _fla_parallax.parallax_decode_one_step,
    },
    "fla.ops.rwkv7.fused_addcmul": {"fused_addcmul_rwkv7": _fla_rwkv.fused_addcmul_rwkv7},
    "fla.ops.rwkv7.fused_k_update": {"fused_k_rwkv7": _fla_rwkv.fused_k_rwkv7},
    "fla.ops.rwkv7.gate_output_correction": {
        "gate_output_correction": _fla_rwkv.gate_output_correction
    },
}
# fla class -> its methods that refuse CPU tensors themselves.
MODULE_METHODS: dict[str, dict[str, Callable]] = {
    "fla.modules.fused_cross_entropy.ops.FusedCrossEntropyLoss": {
        "forward": _cross_entropy_forward
    },
    "fla.modules.fused_linear_cross_entropy.ops.FusedLinearCrossEntropyLoss": {
        "forward": _linear_cross_entropy_forward
    },
    "fla.layers.log_linear_mamba2.LogLinearMamba2": {  # refuses the CPU itself
        "forward": _fla_log_linear.log_linear_mamba2_forward
    },
}


def _replacements() -> dict[int, tuple[object, Callable]]:
    """id(fla's object) -> (fla's object, its CPU-dispatching replacement)."""
    from linattn import compat

    ops = sys.modules["fla.ops"]
    pairs = [
        (getattr(ops, name), getattr(compat, name))
        for name in compat.FLA_ENTRY_POINTS
        if name not in compat.DEPRECATED and hasattr(ops, name)
    ]
    for name, module_name in compat.FLA_SUBMODULE_ENTRY_POINTS.items():  # fla.ops.gdn2's
        pairs.append((getattr(importlib.import_module(module_name), name), getattr(compat, name)))
    for module_name, functions in MODULE_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        pairs += [(getattr(module, name), cpu) for name, cpu in functions.items()]
    return {id(fla_fn): (fla_fn, _on_cpu(fla_fn, cpu)) for fla_fn, cpu in pairs}


def _rebind(namespace: object, name: str, value: object) -> None:
    """Set namespace.name, remembering what it was for ``disable()``."""
    _saved.append((namespace, name, vars(namespace)[name]))
    setattr(namespace, name, value)


def enable() -> None:
    """Make fla's layers and models run on the CPU (CPU tensors only; see the module docstring).

    Imports fla; in every loaded ``fla`` module, each global bound to one of fla's ops or
    Triton-only module functions is rebound to linattn's CPU version, and the losses' forwards
    are replaced on their classes. Calling it twice is harmless; ``disable()`` undoes it.

    Raises:
        ImportError: fla is not installed (the ``linattn[integrations]`` extra).
    """
    if _saved:
        return
    _import_fla()
    replacements = _replacements()
    for module_name in sorted(sys.modules):
        module = sys.modules[module_name]
        if module is None or not (module_name == "fla" or module_name.startswith("fla.")):
            continue
        for name, value in list(vars(module).items()):
            found = replacements.get(id(value))
            if found is not None and found[0] is value:
                _rebind(module, name, found[1])
    for path, methods in MODULE_METHODS.items():
        module_name, _, class_name = path.rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        for name, cpu in methods.items():
            _rebind(cls, name, _method_on_cpu(vars(cls)[name], cpu))
    _fla_attention.enable()  # flash-attn's functions, the stick-breaking layer's forward


def disable() -> None:
    """Undo ``enable()``: every rebound name holds fla's own object again."""
    _fla_attention.disable()
    while _saved:
        namespace, name, original = _saved.pop()
        setattr(namespace, name, original)


def is_enabled() -> bool:
    """Whether ``enable()`` is in effect."""
    return bool(_saved)
