"""``SoftmaxAttention``: causal multi-head softmax attention with a KV cache (spec sections 2, 9).

    o_i = sum_{j <= i} softmax_j(q_i^T k_j / sqrt(D)) v_j

Its generation state is the KV cache, ``k, v: [B, t, H, D]``: 2 t D numbers per head after t
tokens, the one state that grows with t (spec section 9). Optional rotary position embedding (RoPE,
Su et al., 2021) rotates q and k by their absolute position, which the cache supplies: the number of
cached tokens.

Optional short convolution (``short_conv=True``): the causal depthwise convolution + SiLU that the
recurrent mixers put on q, k and v (``ShortConvolution``), here before RoPE. Zoology's MQAR models
put a short convolution in front of every sequence mixer, attention included (Arora et al., 2023);
it lets a key see its neighbour token. Its state is the last ``conv_size - 1`` inputs, a fixed-size
``conv`` entry beside the growing cache, handled as in ``RecurrentMixer``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim
from linattn.layers.modules import ShortConvolution
from linattn.ops.checks import flag


def rotary(x: Tensor, start: int, base: float = 10000.0) -> Tensor:
    """Rotate channel pairs (i, i + D/2) of x [B, T, H, D] by angle (start + t) * base^(-2i/D)."""
    D = x.shape[-1]
    half = D // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2.0 / D)  # [D/2]
    pos = torch.arange(start, start + x.shape[1], dtype=torch.float64, device=x.device)  # [T]
    angle = (pos[:, None] * freq[None, :]).to(x.dtype)  # [T, D/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]  # [T, 1, D/2]: broadcast over H
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
    if D % 2:  # an odd last channel is not rotated
        rotated.append(x[..., 2 * half :])
    return torch.cat(rotated, dim=-1)


class SoftmaxAttention(TokenMixer):
    """Causal softmax attention. Args: d_model, n_heads, head_dim (default d_model // n_heads),
    rope (rotary embeddings, default True), rope_base (10000), short_conv (a causal depthwise
    convolution of kernel ``conv_size`` + SiLU on q, k, v; default False: plain attention)."""

    growing = ("k", "v")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        rope: bool = True,
        rope_base: float = 10000.0,
        short_conv: bool = False,
        conv_size: int = 4,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        self.n_heads, self.head_dim = n_heads, head_dim
        rope, short_conv = flag("rope", rope), flag("short_conv", short_conv)
        self.rope, self.rope_base = rope, rope_base
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)
        # One depthwise convolution over [q | k | v] is three per-channel convolutions.
        self.conv = ShortConvolution(3 * n_heads * head_dim, conv_size) if short_conv else None

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``k``, ``v``: [B, t, H, D] in the model's dtype, t = 0 before the first token; with the
        short convolution also ``conv``, its last ``conv_size - 1`` inputs: [B, 3HD, conv_size - 1].
        """
        shape = (batch_size, 0, self.n_heads, self.head_dim)
        spec: StateSpec = {"k": (shape, dtype), "v": (shape, dtype)}
        if self.conv is not None:
            spec["conv"] = (self.conv.state_shape(batch_size), dtype)
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)  # [B, T, 3HD]
        conv_state = None
        if self.conv is not None:
            qkv, conv_state = self.conv(qkv, None if state is None else state["conv"])
        # [B, T, 3HD] -> 3 x [B, T, H, D]
        q, k, v = (t.reshape(B, T, H, D) for t in qkv.split(H * D, dim=-1))
        start = 0 if state is None else state["k"].shape[1]  # absolute position of the first token
        if self.rope:
            q, k = rotary(q, start, self.rope_base), rotary(k, start, self.rope_base)
        new_state = None
        if state is not None:
            # The cache grows by concatenation: [B, start, H, D] -> [B, start + T, H, D].
            new_state = {
                name: torch.cat([state[name], t], dim=1) for name, t in (("k", k), ("v", v))
            }
            if conv_state is not None:
                new_state["conv"] = conv_state
        if new_state is None:
            o = ops.softmax_attention(q, k, v, causal=True)
        else:  # the T queries are the last T positions of the cached keys and values
            o = ops.softmax_attention(q, new_state["k"], new_state["v"], causal=True)
        return self.o_proj(o.reshape(B, T, H * D)), new_state  # [B, T, H, D] -> [B, T, H*D]
