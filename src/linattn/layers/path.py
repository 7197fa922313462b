"""PaTH attention's layer (Yang et al. 2025) as fla 0.6.0's ``fla.layers.PaTHAttention``
defines it.

q = q_proj x, k = k_proj x, v = v_proj x (RMS-normalised q, k per head with ``use_qk_norm``),
w = l2norm(silu(conv(w_proj x))) (w_proj low-rank through 32 with ``use_low_rank_w``; the short
convolution with ``use_w_shortconv``), beta = 2 sigmoid(bt_proj x) (in (0, 2): negative
eigenvalues allowed), g = logsigmoid(g_proj x) with ``use_forget_gate``; then
``linattn.ops.path`` and ``o_proj``. Generation keeps fla's cache: the keys carried to the last
token (H_t applied to all of them at each new token), the values, and the gates' running sum.
Its arithmetic is in float32, or in float64 for a float64 model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype
from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim, resolve_kv_heads
from linattn.layers.modules import ShortConvolution
from linattn.ops.functional import l2norm
from linattn.ops.path import path_attention

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class PaTHAttention(TokenMixer):
    """fla's PaTHAttention (module docstring). Args (fla's names): d_model (``hidden_size``),
    n_heads (``num_heads``), num_kv_heads (default n_heads; a divisor of it), use_forget_gate
    (False), use_qk_norm (False), use_low_rank_w (True), use_w_shortconv (True), conv_size (3),
    norm_eps (1e-5, fla's RMSNorm), chunk_size (64)."""

    growing = ("k", "v", "G")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        num_kv_heads: int | None = None,
        use_forget_gate: bool = False,
        use_qk_norm: bool = False,
        use_low_rank_w: bool = True,
        use_w_shortconv: bool = True,
        conv_size: int = 3,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        D = resolve_head_dim(d_model, n_heads, None)
        kv_heads = resolve_kv_heads(n_heads, num_kv_heads)
        self.n_heads, self.num_kv_heads, self.head_dim = n_heads, kv_heads, D
        kv_dim = kv_heads * D
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=False)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=False)
        if use_low_rank_w:
            self.w_proj = nn.Sequential(nn.Linear(d_model, 32, bias=False),
                                        nn.Linear(32, kv_dim, bias=False))  # fmt: skip
        else:
            self.w_proj = nn.Linear(d_model, kv_dim, bias=False)
        self.use_qk_norm = use_qk_norm
        if use_qk_norm:
            self.maybe_q_norm = nn.RMSNorm(D, eps=norm_eps)
            self.maybe_k_norm = nn.RMSNorm(D, eps=norm_eps)
        self.w_conv1d = ShortConvolution(kv_dim, conv_size) if use_w_shortconv else None
        self.bt_proj = nn.Linear(d_model, kv_heads, bias=True)
        self.g_proj = nn.Linear(d_model, n_heads, bias=True) if use_forget_gate else None
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    @classmethod
    def from_config(cls, config: LMConfig) -> PaTHAttention:
        """The layer of ``LMConfig.mixers`` name ``"path"``: heads of d_model / n_heads (PaTH's
        layer has no other head width), key/value heads ``num_key_value_heads``, the short
        convolution of w (kernel ``conv_size``) unless ``short_conv`` is False, ``norm_eps``,
        ``chunk_size``; no rotary embedding (PaTH's transitions are its position encoding) and
        fla's defaults otherwise (no forget gate, no q/k norm, w low-rank)."""
        if config.head_dim is not None and config.head_dim * config.n_heads != config.d_model:
            raise ValueError(
                f"LMConfig.head_dim ({config.head_dim}) must be d_model / n_heads "
                f"({config.d_model} / {config.n_heads}) for the path mixer"
            )
        kwargs = dict(num_kv_heads=config.num_key_value_heads, conv_size=config.conv_size,
                      norm_eps=config.norm_eps)  # fmt: skip
        if config.short_conv is not None:
            kwargs["use_w_shortconv"] = config.short_conv
        if config.chunk_size is not None:
            kwargs["chunk_size"] = config.chunk_size
        return cls(config.d_model, config.n_heads, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        H, D = self.num_kv_heads, self.head_dim
        spec = {"k": ((batch_size, 0, H, D), dtype), "v": ((batch_size, 0, H, D), dtype),
                "G": ((batch_size, 0, self.n_heads), compute_dtype(dtype))}  # fmt: skip
        if self.w_conv1d is not None:
            spec["conv_w"] = (self.w_conv1d.state_shape(batch_size), dtype)
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        HQ, H, D = self.n_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, HQ, D)
        k, v = self.k_proj(x).view(B, T, H, D), self.v_proj(x).view(B, T, H, D)
        w = self.w_proj(x)
        conv_w = None
        if self.w_conv1d is not None:
            w, conv_w = self.w_conv1d(w, None if state is None else state.get("conv_w"))
        cd = compute_dtype(x.dtype)  # float32, or float64 for a float64 model
        w = l2norm(w.view(B, T, H, D).to(cd))
        beta = 2 * torch.sigmoid(self.bt_proj(x).to(cd))
        g = None if self.g_proj is None else F.logsigmoid(self.g_proj(x).to(cd))
        if self.use_qk_norm:
            q = self.maybe_q_norm(q.to(cd)).to(x.dtype)
            k = self.maybe_k_norm(k.to(cd)).to(x.dtype)
        if state is None or state["k"].shape[1] == 0:
            o, cache = path_attention(q, k, v, w, beta, g, mode="chunk",
                                      chunk_size=self.chunk_size, return_k_cache=True)  # fmt: skip
            new = None
            if state is not None:
                G = torch.zeros(B, T, HQ, dtype=cd) if g is None else g.cumsum(1)
                new = {"k": cache.to(x.dtype), "v": v, "G": G.to(cd).to(x.device)}
        else:
            o, new = self._decode(q, k, v, w, beta, g, state)
        if new is not None and conv_w is not None:
            new["conv_w"] = conv_w
        return self.o_proj(o.reshape(B, T, HQ * D).to(x.dtype)), new

    def _decode(self, q, k, v, w, beta, g, state):
        """Token by token from fla's cache: the carried keys take the token's transition, then
        the token's key joins them; softmax over c (q . k + G_t - G_s)."""
        HQ, H, D = self.n_heads, self.num_kv_heads, self.head_dim
        cd = compute_dtype(q.dtype)
        keys, values, G = state["k"].to(cd), state["v"].to(cd), state["G"]
        c = D**-0.5
        outs = []
        for t in range(q.shape[1]):
            wt = w[:, t, None]  # [B, 1, H, D]
            keys = keys - beta[:, t, None, :, None] * (keys * wt).sum(-1, keepdim=True) * wt
            keys = torch.cat([keys, k[:, t, None].to(cd)], 1)
            values = torch.cat([values, v[:, t, None].to(cd)], 1)
            last = G[:, -1:] if G.shape[1] else torch.zeros_like(G[:, :1].expand(-1, 1, -1))
            step = torch.zeros_like(last) if g is None else g[:, t, None]
            G = torch.cat([G, last + step], 1)
            kq = keys.repeat_interleave(HQ // H, dim=2)
            scores = torch.einsum("bhd,bshd->bhs", q[:, t].to(cd), kq)
            logits = c * (scores + G[:, -1, :, None] - G.transpose(1, 2))
            vq = values.repeat_interleave(HQ // H, dim=2)
            outs.append(torch.einsum("bhs,bshd->bhd", logits.softmax(-1), vq))
        o = torch.stack(outs, 1)
        dtype = state["k"].dtype
        return o, {"k": keys.to(dtype), "v": values.to(dtype), "G": G}
