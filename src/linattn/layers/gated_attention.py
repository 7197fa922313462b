"""``GatedAttention``: Qwen3-Next's full-attention block, softmax attention with an output gate.

Gated attention (Qiu et al., 2025) as transformers' ``Qwen3NextAttention`` implements it:

    [q_t,h | z_t,h] = W_Q x_t                       per head: D query channels, D gate channels
    q_t,h = rmsnorm(q_t,h), k_t,j = rmsnorm(W_K x_t)_j   per head, weight (1 + w), w = 0 at init
    q, k <- RoPE on their first ``partial_rotary_factor * D`` channels (partial rotary)
    o_t,h = sum_{s <= t} softmax_s(q_t,h^T k_s,j(h) / sqrt(D)) v_s,j(h)   (spec section 2)
    y_t = W_O (o_t * sigmoid(z_t))

with ``num_key_value_heads`` key/value heads shared by groups of query heads (grouped-query
attention: query head h reads key/value head j(h) = h // (H / H_kv)). The generation state is the
KV cache of the H_kv heads, normed and rotated: ``k, v: [B, t, H_kv, D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, resolve_head_dim
from linattn.layers.softmax import rotary
from linattn.ops.checks import flag


class CenteredRMSNorm(nn.Module):
    """``rmsnorm(x) * (1 + weight)`` over the last axis, ``weight`` zero at initialisation
    (Qwen3-Next's q/k norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * (1.0 + self.weight)


def partial_rotary(x: Tensor, start: int, base: float, rotary_dim: int) -> Tensor:
    """RoPE on the first ``rotary_dim`` channels of x [B, T, H, D] (pairs (i, i + rotary_dim / 2),
    frequencies base^(-2i / rotary_dim)); the other channels pass unchanged."""
    if rotary_dim == 0:
        return x
    rotated = rotary(x[..., :rotary_dim], start, base)
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


class GatedAttention(TokenMixer):
    """Qwen3-Next's gated softmax attention.

    Args (transformers' names):
        d_model: width of the residual stream (``hidden_size``).
        n_heads: query heads H (``num_attention_heads``).
        head_dim: D per head (default d_model // H).
        num_key_value_heads: key/value heads, a divisor of H (default H).
        partial_rotary_factor: fraction of each head's channels that RoPE rotates (Qwen3-Next:
            0.25); ``rotary_dim = int(D * partial_rotary_factor)`` must be even.
        rope_base: base of the rotary frequencies (``rope_theta``).
        attention_bias: biases on the four projections.
        norm_eps: epsilon of the q/k RMSNorms (``rms_norm_eps``, 1e-6).
    """

    growing = ("k", "v")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        num_key_value_heads: int | None = None,
        partial_rotary_factor: float = 0.25,
        rope_base: float = 10000.0,
        attention_bias: bool = False,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        D = resolve_head_dim(d_model, n_heads, head_dim)
        H_kv = n_heads if num_key_value_heads is None else num_key_value_heads
        check_positive("num_key_value_heads", H_kv)
        if n_heads % H_kv:
            raise ValueError(f"num_key_value_heads ({H_kv}) must divide n_heads ({n_heads})")
        if not 0 <= partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor must lie in [0, 1], got {partial_rotary_factor!r}"
            )
        rotary_dim = int(D * partial_rotary_factor)
        if rotary_dim % 2:
            raise ValueError(f"head_dim * partial_rotary_factor must be even, got {rotary_dim}")
        bias = flag("attention_bias", attention_bias)
        self.n_heads, self.num_key_value_heads, self.head_dim = n_heads, H_kv, D
        self.rotary_dim, self.rope_base = rotary_dim, rope_base
        self.partial_rotary_factor = partial_rotary_factor
        self.q_proj = nn.Linear(d_model, n_heads * D, bias=bias)
        self.g_proj = nn.Linear(d_model, n_heads * D, bias=bias)
        self.k_proj = nn.Linear(d_model, H_kv * D, bias=bias)
        self.v_proj = nn.Linear(d_model, H_kv * D, bias=bias)
        self.o_proj = nn.Linear(n_heads * D, d_model, bias=bias)
        self.q_norm = CenteredRMSNorm(D, norm_eps)
        self.k_norm = CenteredRMSNorm(D, norm_eps)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``k``, ``v``: [B, t, H_kv, D] in the model's dtype, t = 0 before the first token."""
        shape = (batch_size, 0, self.num_key_value_heads, self.head_dim)
        return {"k": (shape, dtype), "v": (shape, dtype)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, H_kv, D = self.n_heads, self.num_key_value_heads, self.head_dim
        start = 0 if state is None else state["k"].shape[1]
        q = self.q_norm(self.q_proj(x).view(B, T, H, D))  # [B, T, H*D] -> [B, T, H, D]
        k = self.k_norm(self.k_proj(x).view(B, T, H_kv, D))
        v = self.v_proj(x).view(B, T, H_kv, D)
        q = partial_rotary(q, start, self.rope_base, self.rotary_dim)
        k = partial_rotary(k, start, self.rope_base, self.rotary_dim)
        new_state = None
        if state is not None:  # the cache grows by concatenation along t
            k = torch.cat([state["k"], k], dim=1)
            v = torch.cat([state["v"], v], dim=1)
            new_state = {"k": k, "v": v}
        groups = H // H_kv  # [B, t, H_kv, D] -> [B, t, H, D]: head h reads kv head h // groups
        k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        o = ops.softmax_attention(q, k, v, causal=True).reshape(B, T, H * D)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x))), new_state

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> GatedAttention:
        """Our layer with the weights of transformers' ``Qwen3NextAttention`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import gated_attention_from_qwen3_next

        return gated_attention_from_qwen3_next(cls, module, **kwargs)
