"""fla's softmax-attention layers on the CPU: flash-attn's two functions, and the layer checks
that refuse the CPU (part of ``linattn.integrations.fla.enable()``).

fla's ``Attention``, ``MultiheadLatentAttention``, ``BitAttention``, ``MoBA`` and ``Rodimus``
layers call flash-attn (``from flash_attn import flash_attn_func, flash_attn_varlen_func``),
a CUDA-only package; where it is not installed the modules bind ``flash_attn_func = None`` and the
layers refuse to be built. ``enable()`` binds CPU versions in those modules (wrapping flash-attn's
where it is installed, so that CUDA tensors keep it):

- ``flash_attn_func(q, k, v, ...)``: q [B, T_q, HQ, D], k, v [B, T_k, H, D] (HQ a multiple of H);
- ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  ...)``: packed [total, H, D] sequences;

with flash-attn's conventions: ``softmax_scale`` None is 1 / sqrt(D); with T_q != T_k the
queries are the last T_q positions (bottom-right alignment); ``causal`` masks keys after the
query; ``window_size=(left, right)`` keeps keys j with i' - left <= j <= i' + right (i' the
query's aligned position, -1 for no limit); ``softcap`` > 0 caps the scores as
softcap tanh(s / softcap); ``dropout_p`` drops attention weights (training); a query that sees
no key outputs 0. The computation is the explicit masked product (scores, mask, the row maximum
subtracted, the softmax, one product with V) in float32 (float64 for float64) with autograd.

``attn_decoding_one_step`` (fla.ops.attn.decoding: the Forgetting Transformer's, YOCO's and
PaTH's decoding step with padding) is bound in the layers' modules the same way, and so is
``chunk_global_cumsum`` in Wall attention's layer (its KV cache's prefixes). CAT's model
(``fla.models.cat``) calls torch's FlexAttention (``flex_attention_compiled``), whose CPU
implementation has no backward; ``flex_attention`` here is the same masked softmax attention as
an explicit product with autograd, bound in its place.

fla's ``StickBreakingAttention`` layer refuses CPU tensors and float32 projections in its
``forward``; ``enable()`` replaces the forward on the class by one that allows them (CPU tensors
only; other devices keep fla's).
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype

# fla modules whose layers call flash-attn.
FLASH_ATTN_MODULES = (
    "fla.layers.attn",
    "fla.layers.mla",
    "fla.layers.bitattn",
    "fla.layers.moba",
    "fla.layers.rodimus",
    "fla.ops.nsa.naive",  # NSA's sliding-window branch
    "fla.ops.nsa.parallel",
)
_MISSING = object()
_saved: list[tuple[object, str, object]] = []


def _window_mask(T_q: int, T_k: int, causal: bool, window_size, device) -> Tensor:
    """[T_q, T_k] True where query i sees key j (flash-attn's bottom-right alignment)."""
    left, right = window_size
    i = torch.arange(T_q, device=device)[:, None] + (T_k - T_q)
    j = torch.arange(T_k, device=device)[None, :]
    mask = torch.ones(T_q, T_k, dtype=torch.bool, device=device)
    if causal:  # flash-attn: causal is a window with right = 0
        right = 0
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def _attend(q, k, v, scale, causal, window_size, softcap, dropout_p) -> Tensor:
    """One batch of sequences: q [B, T_q, HQ, D], k [B, T_k, H, D], v [B, T_k, H, Dv]."""
    HQ, H = q.shape[2], k.shape[2]
    dtype = compute_dtype(q.dtype)
    qh = q.to(dtype).transpose(1, 2)  # [B, HQ, T_q, D]
    kh = k.to(dtype).transpose(1, 2).repeat_interleave(HQ // H, dim=1)
    vh = v.to(dtype).transpose(1, 2).repeat_interleave(HQ // H, dim=1)
    s = scale * (qh @ kh.transpose(-1, -2))
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = _window_mask(q.shape[1], k.shape[1], causal, window_size, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return (p @ vh).transpose(1, 2).to(q.dtype)


def _check(q, k, v, dropout_p, softmax_scale, window_size, alibi_slopes, return_attn_probs, dims):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
        if x.dim() != dims:
            raise ValueError(f"{name} must have {dims} dimensions, got {tuple(x.shape)}")
    HQ, H = q.shape[-2], k.shape[-2]
    if H == 0 or HQ % H != 0 or v.shape[-2] != H:
        raise ValueError(
            f"q, k, v: the number of query heads ({HQ}) must be a multiple of the key/value "
            f"heads ({H}, v has {v.shape[-2]})"
        )
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if softmax_scale is not None and not math.isfinite(float(softmax_scale)):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if len(tuple(window_size)) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: linattn's CPU flash attention has no ALiBi")
    if return_attn_probs:
        raise NotImplementedError("return_attn_probs: linattn's CPU flash attention returns o")


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Tensor:
    """flash-attn's ``flash_attn_func`` on the CPU: o_i = sum_j softmax_j(scale q_i^T k_j) v_j
    over the keys query i sees (the module docstring); q [B, T_q, HQ, D], k, v [B, T_k, H, *]."""
    _check(q, k, v, dropout_p, softmax_scale, window_size, alibi_slopes, return_attn_probs, 4)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return _attend(q, k, v, scale, bool(causal), tuple(window_size), softcap, dropout_p)


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
) -> Tensor:
    """flash-attn's ``flash_attn_varlen_func`` on the CPU: ``flash_attn_func`` on each packed
    sequence, q [total_q, HQ, D] cut by cu_seqlens_q, k, v [total_k, H, *] by cu_seqlens_k."""
    _check(q, k, v, dropout_p, softmax_scale, window_size, alibi_slopes, return_attn_probs, 3)
    if block_table is not None:
        raise NotImplementedError("block_table: linattn's CPU flash attention has no paged cache")
    bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if (
        len(bq) != len(bk)
        or bq[0] != 0
        or bk[0] != 0
        or bq[-1] != q.shape[0]
        or bk[-1] != k.shape[0]
    ):
        raise ValueError(
            f"cu_seqlens_q, cu_seqlens_k must cut q ({q.shape[0]} tokens) and k ({k.shape[0]}) "
            f"into as many sequences, got {bq} and {bk}"
        )
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    parts = [
        _attend(q[None, a:b], k[None, c:d], v[None, c:d], scale, bool(causal), tuple(window_size),
                softcap, dropout_p)[0]
        for a, b, c, d in zip(bq[:-1], bq[1:], bk[:-1], bk[1:], strict=True)
    ]  # fmt: skip
    return torch.cat(parts, dim=0) if parts else q.new_zeros(0, q.shape[1], v.shape[-1])


def attn_decoding_one_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: Tensor | None = None,
    do_gate_scale: bool = False,
    *,
    window_size: int | None = None,
    sink_bias: Tensor | None = None,
) -> Tensor:
    """fla's ``attn_decoding_one_step`` on the CPU (the decoding step of the Forgetting
    Transformer's layer): sequence n's one query q[0, n], at its sequence's last position, reads
    its keys k[0, c_n:c_{n+1}] with logits scale q^T k_s + (G_last - G_s) (the gates times scale
    with ``do_gate_scale``), the last ``window_size`` keys (0: a zero output), and the sink.
    q [1, N, HQ, K], k [1, T, H, K], v [1, T, H, V], g [1, T, HQ]; returns o [1, N, HQ, V]."""
    if cu_seqlens is None:
        raise ValueError("cu_seqlens: the decoding step needs the sequences' bounds")
    if window_size is not None and window_size < 0:
        raise ValueError(f"window_size must be nonnegative, got {window_size}")
    HQ, K, H, V = q.shape[2], q.shape[3], k.shape[2], v.shape[3]
    if H == 0 or HQ % H != 0:
        raise ValueError(f"q: the query heads ({HQ}) must be a multiple of the key heads ({H})")
    scale = K**-0.5 if scale is None else float(scale)
    dtype = compute_dtype(q.dtype)
    bounds = cu_seqlens.tolist()
    outs = []
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if b == a or window_size == 0:
            outs.append(q.new_zeros(HQ, V, dtype=dtype))
            continue
        ks = k[0, a:b].to(dtype).repeat_interleave(HQ // H, dim=1)  # [T_n, HQ, K]
        vs = v[0, a:b].to(dtype).repeat_interleave(HQ // H, dim=1)
        logits = scale * torch.einsum("hk,thk->ht", q[0, n].to(dtype), ks)  # [HQ, T_n]
        if g is not None:
            G = g[0, a:b].to(dtype).cumsum(0).T  # [HQ, T_n]
            logits = logits + (scale if do_gate_scale else 1.0) * (G[:, -1:] - G)
        if window_size is not None:
            logits[:, : max(0, b - a - window_size)] = float("-inf")
        if sink_bias is not None:
            logits = torch.cat([logits, sink_bias.to(dtype)[:, None]], dim=1)
            vs = torch.cat([vs, vs.new_zeros(1, HQ, V)], dim=0)  # the sink adds no value
        outs.append(torch.einsum("ht,thv->hv", torch.softmax(logits, dim=-1), vs))
    return torch.stack(outs)[None].to(q.dtype)


def chunk_global_cumsum(
    s: Tensor,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
    scale: float | None = None,
    output_dtype: torch.dtype | None = torch.float,
    **kwargs,
) -> Tensor:
    """fla's ``chunk_global_cumsum`` on the CPU (Wall attention's layer forms its cache's
    prefixes with it): the cumulative sum of s [B, T, H(, K)] along T in each sequence (from the
    last token with ``reverse``), times ``scale``, in ``output_dtype`` (None: s's dtype)."""
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed: inputs are [B, T, H, ...]")
    work = compute_dtype(s.dtype)
    x = s.to(work)
    bounds = [0, s.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        piece = x[:, a:b]
        piece = piece.flip(1).cumsum(1).flip(1) if reverse else piece.cumsum(1)
        parts.append(piece)
    out = torch.cat(parts, dim=1) if parts else x
    if scale is not None:
        out = out * scale
    return out.to(s.dtype if output_dtype is None else output_dtype)


def flex_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_mask=None,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """torch's ``flex_attention`` without a ``score_mod`` (CAT's compressor and decoder):
    o_i = sum_j softmax_j(scale q_i^T k_j) v_j over the keys j with ``mask_mod(b, h, i, j)``
    true (``block_mask``'s predicate; None: every key), a query without keys giving 0, as
    FlexAttention does. q [B, HQ, L, E], k [B, H, S, E], v [B, H, S, Ev] (HQ = H, or a multiple
    with ``enable_gqa``); ``scale`` None is 1 / sqrt(E). The mask is the dense one of torch's
    ``create_mask`` at the batch and head sizes the block mask was built for (1 each: built with
    B = H = None, the predicate's b = h = 0 for all). The explicit product in float32 (float64
    for float64) with autograd; o in q's dtype."""
    from torch.nn.attention.flex_attention import create_mask

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.dim() != 4:
            raise ValueError(f"{name} must be a floating-point [B, H, T, D] tensor")
    B, HQ, L, E = q.shape
    H, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != E:
        raise ValueError(
            f"k must be [B, H, S, {E}] and v [B, H, S, Ev] with q's B = {B}, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if HQ != H and not (enable_gqa and H > 0 and HQ % H == 0):
        raise ValueError(
            f"q has {HQ} heads and k, v {H}: equal, or a multiple with enable_gqa=True"
        )
    dtype = compute_dtype(q.dtype)
    qf, kf, vf = (x.to(dtype) for x in (q, k, v))
    if HQ != H:
        kf, vf = kf.repeat_interleave(HQ // H, dim=1), vf.repeat_interleave(HQ // H, dim=1)
    scale = E**-0.5 if scale is None else float(scale)
    s = scale * (qf @ kf.transpose(-1, -2))  # [B, HQ, L, S]
    if block_mask is not None:
        if tuple(block_mask.seq_lengths) != (L, S):
            raise ValueError(
                f"block_mask was built for (Q_LEN, KV_LEN) = {tuple(block_mask.seq_lengths)}, "
                f"q and k have ({L}, {S})"
            )
        mB, mH = block_mask.kv_num_blocks.shape[:2]
        mask = create_mask(block_mask.mask_mod, None if mB == 1 else mB,
                           None if mH == 1 else mH, L, S, device=q.device)  # fmt: skip
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    return (p @ vf).to(q.dtype)


def _stickbreaking_forward(self, hidden_states, attention_mask=None, past_key_values=None,
                           output_attentions=False, use_cache=False, **kwargs):  # fmt: skip
    """fla's ``StickBreakingAttention.forward`` without its refusal of CPU tensors and float32
    projections: the same projections, optional q/k norms, unpadding and the op."""
    from fla.layers.utils import repad_hidden_states, unpad_hidden_states

    from linattn.compat import parallel_stickbreaking_attn

    if use_cache or past_key_values is not None:
        raise NotImplementedError("stick-breaking attention has no KV-cache decoding")
    if output_attentions:
        raise NotImplementedError("stick-breaking attention does not return attention matrices")
    B, T, _ = hidden_states.shape
    if attention_mask is not None and attention_mask.shape != (B, T):
        raise ValueError("attention_mask must have shape [batch_size, sequence_length]")
    cu_seqlens = kwargs.get("cu_seqlens")
    if cu_seqlens is not None and B != 1:
        raise ValueError("cu_seqlens: packed inputs need batch size 1")
    x, indices, cu_seqlens = unpad_hidden_states(
        hidden_states=hidden_states, cu_seqlens=cu_seqlens, attention_mask=attention_mask, q_len=T
    )
    d = self.head_dim
    q, k, v = (proj(x).unflatten(-1, (-1, d)) for proj in (self.q_proj, self.k_proj, self.v_proj))
    if self.qk_norm:
        q, k = self.q_norm(q), self.k_norm(k)
    o, _ = parallel_stickbreaking_attn(q, k, v, attend_current=self.attend_current,
                                       cu_seqlens=cu_seqlens)  # fmt: skip
    o = self.o_proj(o.flatten(-2))
    return repad_hidden_states(hidden_states=o, indices=indices, batch_size=B, q_len=T), None, None


# fla module -> {function bound there: its CPU version}
MODULE_FUNCTIONS: dict[str, dict[str, Callable]] = {
    name: {"attn_decoding_one_step": attn_decoding_one_step}
    for name in (
        "fla.ops.attn.decoding",
        "fla.layers.forgetting_attn",
        "fla.layers.yoco",
        "fla.layers.path_attn",
    )
}
MODULE_FUNCTIONS["fla.layers.wall_attn"] = {"chunk_global_cumsum": chunk_global_cumsum}
MODULE_FUNCTIONS["fla.models.cat.modeling_cat"] = {"flex_attention_compiled": flex_attention}
# fla class -> {method: its CPU version}
LAYER_METHODS: dict[str, dict[str, Callable]] = {
    "fla.layers.stickbreaking_attn.StickBreakingAttention": {"forward": _stickbreaking_forward},
}


def _on_cpu(original: Callable | None, cpu: Callable) -> Callable:
    """cpu where flash-attn is absent; with it, cpu for CPU tensors and flash-attn otherwise."""
    if original is None:
        return cpu

    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)), None)
        if first is None or first.device.type == "cpu":
            return cpu(*args, **kwargs)
        return original(*args, **kwargs)

    return dispatch


def _method_on_cpu(original: Callable, cpu: Callable) -> Callable:
    @functools.wraps(original)
    def dispatch(self, hidden_states, *args, **kwargs):
        if hidden_states.device.type == "cpu":
            return cpu(self, hidden_states, *args, **kwargs)
        return original(self, hidden_states, *args, **kwargs)

    dispatch.linattn_cpu = cpu
    return dispatch


def _rebind(namespace: object, name: str, value: object) -> None:
    _saved.append((namespace, name, vars(namespace).get(name, _MISSING)))
    setattr(namespace, name, value)


def enable() -> None:
    """Bind the CPU flash-attn functions in ``FLASH_ATTN_MODULES`` (loaded ones) and the CPU
    layer methods of ``LAYER_METHODS``; ``disable()`` undoes it. Called by
    ``linattn.integrations.fla.enable()`` once fla is imported."""
    if _saved:
        return
    cpu = {"flash_attn_func": flash_attn_func, "flash_attn_varlen_func": flash_attn_varlen_func}
    for module_name in FLASH_ATTN_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, function in cpu.items():
            _rebind(module, name, _on_cpu(vars(module).get(name), function))
    for module_name, functions in MODULE_FUNCTIONS.items():
        module = sys.modules.get(module_name)
        for name, function in functions.items():
            if module is not None and callable(vars(module).get(name)):
                _rebind(module, name, _on_cpu(vars(module)[name], function))
    for path, methods in LAYER_METHODS.items():
        module_name, _, class_name = path.rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        for name, function in methods.items():
            _rebind(cls, name, _method_on_cpu(vars(cls)[name], function))


def disable() -> None:
    """Put back what ``enable()`` replaced (a name fla's module did not bind is removed)."""
    while _saved:
        namespace, name, original = _saved.pop()
        if original is _MISSING:
            delattr(namespace, name)
        else:
            setattr(namespace, name, original)
