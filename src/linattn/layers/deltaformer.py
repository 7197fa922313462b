"""DeltaFormer's layer (Zhong et al. 2025) as fla 0.6.0's ``fla.layers.DeltaFormerAttention``
defines it.

q = q_proj x, k = k_proj x, v = v_proj x (optionally RMS-normalised q, k per head: ``qk_norm``),
beta = b_proj x (not squashed: fla feeds it as it is), rotary embeddings on q and k (rotate-half,
base ``rope_theta``), then ``linattn.ops.deltaformer`` (the pseudo-values u with fla's
convention, then causal softmax attention over (k, u)) and ``o_proj``. fla's layer has no cache;
this one caches k and u (a KV cache whose values are the pseudo-values), so that it generates:
a token's u_t reads the cached (k, u), o_t the cache and itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim
from linattn.layers.softmax import rotary
from linattn.ops.deltaformer import deltaformer


class DeltaFormer(TokenMixer):
    """fla's DeltaFormerAttention (module docstring). Args (fla's names): d_model
    (``hidden_size``), n_heads (``num_heads``), num_kv_heads (must equal n_heads: fla's op
    computes u with q's heads), qkv_bias (False), qk_norm (False), rope_theta (10000),
    norm_eps (1e-5, fla's RMSNorm default), chunk_size (the solve's block, fla's 512)."""

    growing = ("k", "u")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        num_kv_heads: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
        chunk_size: int = 512,
    ) -> None:
        super().__init__(d_model, chunk_size)
        head_dim = resolve_head_dim(d_model, n_heads, None)
        if num_kv_heads is not None and num_kv_heads != n_heads:
            raise ValueError(
                f"num_kv_heads must equal n_heads ({n_heads}) for DeltaFormer (u is computed with "
                f"q's heads), got {num_kv_heads}"
            )
        self.n_heads, self.head_dim, self.rope_theta = n_heads, head_dim, float(rope_theta)
        self.q_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.b_proj = nn.Linear(d_model, n_heads, bias=True)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = nn.RMSNorm(head_dim, eps=norm_eps)
            self.k_norm = nn.RMSNorm(head_dim, eps=norm_eps)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        shape = (batch_size, 0, self.n_heads, self.head_dim)
        return {"k": (shape, dtype), "u": (shape, dtype)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q, k, v = (p(x).view(B, T, H, D) for p in (self.q_proj, self.k_proj, self.v_proj))
        beta = self.b_proj(x)
        if self.qk_norm:
            q, k = self.q_norm(q.float()).to(x.dtype), self.k_norm(k.float()).to(x.dtype)
        start = 0 if state is None else state["k"].shape[1]
        q, k = rotary(q, start, self.rope_theta), rotary(k, start, self.rope_theta)
        if state is None or start == 0:
            o, u = deltaformer(q, k, v, beta, mode="chunk", chunk_size=self.chunk_size,
                               return_u=True)  # fmt: skip
            new = None if state is None else {"k": k, "u": u}
            return self.o_proj(o.reshape(B, T, H * D)), new
        k_all, u_all = state["k"], state["u"]
        c = D**-0.5
        outs = []
        for t in range(T):  # u_t reads the cache; o_t the cache and the token itself
            scores = torch.einsum("bhd,bshd->bhs", q[:, t], k_all) * c
            read = torch.einsum("bhs,bshd->bhd", scores.softmax(-1), u_all)
            u_t = v[:, t] - beta[:, t, :, None] * read
            k_all = torch.cat([k_all, k[:, t : t + 1]], 1)
            u_all = torch.cat([u_all, u_t[:, None]], 1)
            scores = torch.einsum("bhd,bshd->bhs", q[:, t], k_all) * c
            outs.append(torch.einsum("bhs,bshd->bhd", F.softmax(scores, -1), u_all))
        o = torch.stack(outs, 1)
        return self.o_proj(o.reshape(B, T, H * D)), {"k": k_all, "u": u_all}
