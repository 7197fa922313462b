"""``ForgettingAttention``: the Forgetting Transformer's attention layer (Lin et al., 2025), with
the parameters and conventions of fla 0.6.0's ``fla.layers.ForgettingAttention``.

    q, k, v = x W_q, x W_k, x W_v;   log f_t = logsigmoid(x_t W_f + b_f)   (one gate per head)
    o_t = FoX(q, k, v, log f)_t   (``linattn.ops.softmax_variants.forgetting_attention``)
    y = (sigmoid(x W_g) * o) W_o   (the output gate optional)

Grouped heads (``num_kv_heads``) as fla's. ``window_size`` windows the attention here; fla's
layer passes it to its KV cache only, so that its training forward is not windowed. Its
parameter names are fla's (``q_proj``, ``k_proj``, ``v_proj``, ``f_proj``, ``g_proj``,
``o_proj``), so fla's weights load with ``load_state_dict`` (fla's ``qk_norm`` is not offered).
No KV cache: a training and prefill layer.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from linattn.ops.checks import flag
from linattn.ops.softmax_variants import forgetting_attention


class ForgettingAttention(nn.Module):
    """FoX attention (the module docstring). Args: hidden_size, num_heads, num_kv_heads (default
    num_heads), qkv_bias, window_size (None: every earlier key), use_output_gate, mode
    ("parallel": the masked product, "chunk": blockwise), chunk_size."""

    def __init__(
        self,
        hidden_size: int = 2048,
        num_heads: int = 32,
        num_kv_heads: int | None = None,
        qkv_bias: bool = False,
        window_size: int | None = None,
        use_output_gate: bool = False,
        *,
        mode: str = "parallel",
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                f"({num_kv_heads})"
            )
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads")
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.window_size, self.mode, self.chunk_size = window_size, mode, chunk_size
        self.use_output_gate = flag("use_output_gate", use_output_gate)
        kv_dim = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, kv_dim, bias=qkv_bias)
        self.f_proj = nn.Linear(hidden_size, num_heads, bias=True)
        if self.use_output_gate:
            self.g_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        """x [B, T, hidden_size] -> y [B, T, hidden_size]; ``cu_seqlens`` for packed sequences
        (B = 1)."""
        d = self.head_dim
        q = self.q_proj(x).unflatten(-1, (-1, d))
        k = self.k_proj(x).unflatten(-1, (-1, d))
        v = self.v_proj(x).unflatten(-1, (-1, d))
        log_f = F.logsigmoid(self.f_proj(x).float()).to(q.dtype)
        o = forgetting_attention(q, k, v, log_f, window_size=self.window_size,
                                 cu_seqlens=cu_seqlens, mode=self.mode,
                                 chunk_size=self.chunk_size)  # fmt: skip
        o = o.flatten(-2)
        if self.use_output_gate:
            o = self.g_proj(x).sigmoid() * o
        return self.o_proj(o)
