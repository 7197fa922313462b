"""``StickBreakingAttention``: stick-breaking attention's layer (Tan et al. 2024, "Scaling
Stick-Breaking Attention: An Efficient Implementation and In-depth Study", section 2), as fla
0.6.0's ``fla.layers.StickBreakingAttention`` defines it, with a KV cache:

    q, k, v = W_q x, W_k x, W_v x        (per-head RMSNorm of q and k with ``qk_norm``)
    beta_ts = sigmoid(q_t^T k_s / sqrt(D))
    A_ts = beta_ts prod_{s < i < t} (1 - beta_ti)    (s < t; s <= t, i <= t with attend_current)
    o_t = sum_s A_ts v_s,   y = W_o o

No positional embedding (the stick is broken nearest key first) and no normalisation: the
weights sum to 1 - prod_s (1 - beta_ts), the stick left unused is dropped, as fla's layer drops
it. Grouped key/value heads (``num_kv_heads``) as fla's. A prompt runs
``linattn.ops.softmax_variants.stickbreaking_attention`` (registry entry "stickbreaking"); tokens
after a cached prefix attend to the cache and to each other with the same weights, computed in
log space: log A_ts = logsigmoid(z_ts) + sum_{s < i, i seen by t} logsigmoid(-z_ti). fla's layer
has no cache; its state here is the keys and values [B, t, H_kv, D].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype
from linattn.layers._reference import check_type, load
from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim, resolve_kv_heads
from linattn.ops.checks import flag
from linattn.ops.softmax_variants import stickbreaking_attention

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class StickBreakingAttention(TokenMixer):
    """Stick-breaking attention with a KV cache (the module docstring). Args: ``d_model``,
    ``n_heads``, ``head_dim`` (default d_model // n_heads); ``num_kv_heads`` (default n_heads; a
    divisor of it); ``qkv_bias`` (False), ``qk_norm`` (False), ``attend_current`` (False),
    ``norm_eps`` (1e-6): fla's; ``chunk_size``: the op's blocks. Parameters named as fla's."""

    growing = ("k", "v")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        num_kv_heads: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attend_current: bool = False,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        D = resolve_head_dim(d_model, n_heads, head_dim)
        kv_heads = resolve_kv_heads(n_heads, num_kv_heads)
        qkv_bias = flag("qkv_bias", qkv_bias)
        self.qk_norm = flag("qk_norm", qk_norm)
        self.attend_current = flag("attend_current", attend_current)
        self.n_heads, self.num_kv_heads, self.head_dim = n_heads, kv_heads, D
        self.q_proj = nn.Linear(d_model, n_heads * D, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, kv_heads * D, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, kv_heads * D, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * D, d_model, bias=False)
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(D, eps=norm_eps)
            self.k_norm = nn.RMSNorm(D, eps=norm_eps)

    @classmethod
    def from_config(cls, config: LMConfig) -> StickBreakingAttention:
        """The mixer ``"stickbreaking"`` of ``LMConfig.mixers``: the config's ``head_dim``,
        ``num_key_value_heads`` and ``chunk_size``; fla's defaults otherwise."""
        kwargs = dict(head_dim=config.head_size, num_kv_heads=config.num_key_value_heads)
        if config.chunk_size is not None:
            kwargs["chunk_size"] = config.chunk_size
        return cls(config.d_model, config.n_heads, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``k``, ``v``: [B, t, H_kv, D] in the model's dtype, t = 0 at first."""
        kv = (batch_size, 0, self.num_kv_heads, self.head_dim)
        return {"k": (kv, dtype), "v": (kv, dtype)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        HQ, H, D = self.n_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, HQ, D)
        k, v = self.k_proj(x).view(B, T, H, D), self.v_proj(x).view(B, T, H, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cached = 0 if state is None else state["k"].shape[1]
        new = None
        if state is not None:
            new = {"k": torch.cat([state["k"], k], 1), "v": torch.cat([state["v"], v], 1)}
        if cached == 0 and B > 0:
            mode = "parallel" if self.mode == "parallel" else "chunk"
            o, _ = stickbreaking_attention(q, k, v, attend_current=self.attend_current, mode=mode,
                                           chunk_size=self.chunk_size)  # fmt: skip
        else:  # an empty batch too: the op's empty output would cut the graph off
            o = self._attend_cache(q, {"k": k, "v": v} if new is None else new, cached)
        return self.o_proj(o.reshape(B, T, HQ * D).to(x.dtype)), new

    def _attend_cache(self, q: Tensor, cache: State, cached: int) -> Tensor:
        """The T new queries (positions cached .. cached + T - 1) over the whole cache (the
        module docstring's log-space weights); [B, T, HQ, D] in the compute dtype."""
        cd = compute_dtype(q.dtype)
        T, group = q.shape[1], self.n_heads // self.num_kv_heads
        keys = cache["k"].to(cd).repeat_interleave(group, dim=2)  # [B, S, HQ, D]
        values = cache["v"].to(cd).repeat_interleave(group, dim=2)
        z = torch.einsum("bthd,bshd->bhts", q.to(cd), keys) * self.head_dim**-0.5
        S = keys.shape[1]
        rows = torch.arange(cached, cached + T, device=q.device)[:, None]
        cols = torch.arange(S, device=q.device)[None, :]
        seen = cols <= rows if self.attend_current else cols < rows  # [T, S]
        # The stick's unused part at key s: sum over the seen keys i > s of log(1 - beta_ti).
        left = F.logsigmoid(-z).masked_fill(~seen, 0.0)
        after = left.flip(-1).cumsum(-1).flip(-1)  # sum_{i >= s}
        after = torch.cat([after[..., 1:], torch.zeros_like(after[..., :1])], -1)  # i > s
        weights = (F.logsigmoid(z) + after).exp().masked_fill(~seen, 0.0)
        return torch.einsum("bhts,bshd->bthd", weights, values)

    @classmethod
    def from_fla(cls, module: nn.Module) -> StickBreakingAttention:
        """Our layer with the options and weights of fla's ``StickBreakingAttention``."""
        check_type(module, "StickBreakingAttention", "fla")
        if not type(module).__module__.startswith("fla."):  # ours has fla's class name
            raise TypeError(
                f"module must be fla's StickBreakingAttention, got {type(module).__module__}"
            )
        eps = 1e-6
        if module.qk_norm:
            norms = (module.q_norm, module.k_norm)
            if any(n.weight is None or getattr(n, "bias", None) is not None for n in norms):
                raise ValueError("StickBreakingAttention: only q/k norms with a weight, no bias")
            eps = module.q_norm.eps
        layer = cls(
            module.hidden_size, module.num_heads, num_kv_heads=module.num_kv_heads,
            qkv_bias=module.qkv_bias, qk_norm=module.qk_norm,
            attend_current=module.attend_current, norm_eps=eps,
        )  # fmt: skip
        weights = {}
        names = ["q_proj", "k_proj", "v_proj", "o_proj"] + (
            ["q_norm", "k_norm"] if module.qk_norm else []
        )
        for name in names:
            for p, t in getattr(module, name).named_parameters():
                weights[f"{name}.{p}"] = t
        return load(layer, weights, module.q_proj.weight)
