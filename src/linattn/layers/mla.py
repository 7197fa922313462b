"""``MultiHeadLatentAttention``: softmax attention whose cache is a low-rank latent (MLA).

DeepSeek-V2 (DeepSeek-AI, 2024), as transformers' Kimi-Linear implements it
(``KimiLinearAttention``: Kimi Linear's full-attention layers, with NoPE):

    c_t = rmsnorm(W_DKV x_t)                   [kv_lora_rank]       the compressed latent (cached)
    k_t^R = W_KR x_t (RoPE(k_t^R) with rope)   [qk_rope_head_dim]   shared by the heads (cached)
    [k_t,h^C, v_t,h] = W_UKV c_t               per head: [qk_nope_head_dim], [v_head_dim]
    q_t,h = [q_t,h^C, q_t,h^R] = W_Q x_t  (or W_UQ rmsnorm(W_DQ x_t) with q_lora_rank)
    k_t,h = [k_t,h^C, k_t^R]
    o_t = W_O [softmax_j(q_t,h^T k_j,h / sqrt(qk_nope_head_dim + qk_rope_head_dim)) v_j,h]_h

The generation cache holds ``c`` and ``k^R`` only: ``kv_lora_rank + qk_rope_head_dim`` numbers per
token and layer, whatever the number of heads (multi-head attention: 2 H D; spec section 9). The
cached latents are expanded to keys and values at every step (the plain form; absorbing W_UK into
W_Q is an optimisation that gives the same numbers).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive
from linattn.layers.softmax import rotary
from linattn.ops.checks import flag


def _check_size(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class MultiHeadLatentAttention(TokenMixer):
    """Multi-head latent attention (transformers' / DeepSeek's option names).

    Args:
        d_model: width of the residual stream (``hidden_size``).
        n_heads: number of heads H (``num_attention_heads``).
        kv_lora_rank: rank of the key/value latent c (512 in DeepSeek-V2 and Kimi Linear).
        q_lora_rank: None for a full query projection (Kimi Linear), else the rank of the
            query's low-rank projection (1536 in DeepSeek-V2).
        qk_nope_head_dim: per-head query/key channels from the latent (default d_model // H).
        qk_rope_head_dim: query/key channels shared through ``k^R`` (64 in both; 0 for none).
        v_head_dim: value dimension per head (default qk_nope_head_dim).
        rope: rotate the ``qk_rope_head_dim`` channels by position (DeepSeek-V2, default);
            False is NoPE, Kimi Linear's MLA layers: the shared channels stay, unrotated.
        rope_base: base of the rotary frequencies.
        attention_bias: biases on the down projections and the output (``attention_bias``).
        norm_eps: epsilon of the latents' RMSNorms (1e-6, as transformers' Kimi-Linear).
    """

    growing = ("c_kv", "k_rot")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = None,
        qk_nope_head_dim: int | None = None,
        qk_rope_head_dim: int = 64,
        v_head_dim: int | None = None,
        rope: bool = True,
        rope_base: float = 10000.0,
        attention_bias: bool = False,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("n_heads", n_heads)
        check_positive("kv_lora_rank", kv_lora_rank)
        if q_lora_rank is not None:
            check_positive("q_lora_rank", q_lora_rank)
        if qk_nope_head_dim is None:
            qk_nope_head_dim = d_model // n_heads
        check_positive("qk_nope_head_dim", qk_nope_head_dim)
        _check_size("qk_rope_head_dim", qk_rope_head_dim, 0)
        v_head_dim = qk_nope_head_dim if v_head_dim is None else v_head_dim
        check_positive("v_head_dim", v_head_dim)
        self.rope, attention_bias = flag("rope", rope), flag("attention_bias", attention_bias)
        self.rope_base = rope_base
        self.n_heads, self.kv_lora_rank, self.q_lora_rank = n_heads, kv_lora_rank, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim = v_head_dim
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        H = n_heads
        if q_lora_rank is None:
            self.q_proj: nn.Module = nn.Linear(d_model, H * qk_head_dim, bias=False)
        else:
            self.q_proj = nn.Sequential(
                nn.Linear(d_model, q_lora_rank, bias=attention_bias),
                nn.RMSNorm(q_lora_rank, eps=norm_eps),
                nn.Linear(q_lora_rank, H * qk_head_dim, bias=False),
            )
        self.kv_a_proj = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=attention_bias)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, H * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * v_head_dim, d_model, bias=attention_bias)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``c_kv``: [B, t, kv_lora_rank], ``k_rot``: [B, t, qk_rope_head_dim] in the model's
        dtype, t = 0 before the first token: the compressed cache."""
        return {
            "c_kv": ((batch_size, 0, self.kv_lora_rank), dtype),
            "k_rot": ((batch_size, 0, self.qk_rope_head_dim), dtype),
        }

    def latents(self, x: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """x [B, T, d_model] -> (c [B, T, kv_lora_rank], k^R [B, T, qk_rope_head_dim]), k^R rotated
        by the absolute positions start ... start + T - 1 with ``rope``."""
        c, k_rot = self.kv_a_proj(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        if self.rope and self.qk_rope_head_dim:
            k_rot = rotary(k_rot[:, :, None], start, self.rope_base)[:, :, 0]  # one shared head
        return self.kv_norm(c), k_rot

    def expand(self, c: Tensor, k_rot: Tensor) -> tuple[Tensor, Tensor]:
        """The latents of t tokens -> keys [B, t, H, nope + rope] and values [B, t, H, v]."""
        B, t, _ = c.shape
        H, dn, dr = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        kv = self.kv_b_proj(c).view(B, t, H, dn + self.v_head_dim)  # [B, t, H*(dn+dv)] -> heads
        k_nope, v = kv.split([dn, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rot[:, :, None].expand(B, t, H, dr)], dim=-1)
        return k, v

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, dn, dr = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        start = 0 if state is None else state["c_kv"].shape[1]
        q = self.q_proj(x).view(B, T, H, dn + dr)  # [B, T, H*(dn+dr)] -> [B, T, H, dn+dr]
        if self.rope and dr:
            q = torch.cat([q[..., :dn], rotary(q[..., dn:], start, self.rope_base)], dim=-1)
        c, k_rot = self.latents(x, start)
        new_state = None
        if state is not None:  # the cache grows by concatenation along t
            c = torch.cat([state["c_kv"], c], dim=1)
            k_rot = torch.cat([state["k_rot"], k_rot], dim=1)
            new_state = {"c_kv": c, "k_rot": k_rot}
        k, v = self.expand(c, k_rot)
        o = ops.softmax_attention(q, k, v, causal=True, scale=(dn + dr) ** -0.5)
        return self.o_proj(o.reshape(B, T, H * self.v_head_dim)), new_state

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> MultiHeadLatentAttention:
        """Our layer with the weights of transformers' ``KimiLinearAttention`` (NoPE: ``rope``
        False; see ``linattn.layers.convert``)."""
        from linattn.layers.convert import mla_from_kimi_linear

        return mla_from_kimi_linear(cls, module, **kwargs)
