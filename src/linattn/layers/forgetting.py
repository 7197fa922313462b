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

The forget gates' bias starts at zero (fla's and the paper's), an initial gate sigmoid(0) = 1/2
a token. ``dt_init_range = (lo, hi)`` starts it instead at b_h = -log(expm1(dt_h)), so that head
h's initial gate (at x = 0) is f = exp(-dt_h), a decay time of 1 / dt_h tokens, with dt_h spread
geometrically from lo (head 0) to hi (the last head; sqrt(lo hi) for one head): the
decay-time initialisation the FoX paper gives its data-independent gates, and the convention of
the decays' ``dt_init_range`` (``DecayGate``: log f = -dt at the start, A = 1). The heads are
spread evenly rather than drawn, so that two heads cover both ends. ``init_gates()`` sets it
(``CausalLM``'s initialisation, which zeroes every bias, calls it afterwards).

``ForgettingAttentionMixer``: the same attention as a ``TokenMixer`` with a KV cache (the mixer
``"forgetting"`` of ``LMConfig.mixers``). Its state holds the keys, the values and the running
sum G_t = sum_{i <= t} log f_i per head, so that a new token's logits are
scale q_t^T k_s + G_t - G_s over the cache. Its parameters are named as ``ForgettingAttention``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype
from linattn.layers.mixer import State, StateSpec, TokenMixer, resolve_head_dim, resolve_kv_heads
from linattn.layers.modules import check_dt_range
from linattn.layers.options import dt_options
from linattn.ops.checks import flag
from linattn.ops.softmax_variants import forgetting_attention

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


def forget_bias(n_heads: int, dt_init_range: tuple[float, float]) -> Tensor:
    """The forget gates' initial bias per head (the module docstring): b_h = -log(expm1(dt_h)),
    so that sigmoid(b_h) = exp(-dt_h), with dt_h = lo (hi / lo)^(h / (H - 1))."""
    lo, hi = dt_init_range
    u = torch.linspace(0.0, 1.0, n_heads, dtype=torch.float64)
    if n_heads == 1:
        u = torch.full((1,), 0.5, dtype=torch.float64)
    dt = lo * (hi / lo) ** u
    return -torch.log(torch.expm1(dt))


def _init_forget_bias(f_proj: nn.Linear, dt_init_range: tuple[float, float] | None) -> None:
    with torch.no_grad():
        if dt_init_range is None:
            f_proj.bias.zero_()
        else:
            f_proj.bias.copy_(forget_bias(f_proj.out_features, dt_init_range))


class ForgettingAttention(nn.Module):
    """FoX attention (the module docstring). Args: hidden_size, num_heads, num_kv_heads (default
    num_heads), qkv_bias, window_size (None: every earlier key), use_output_gate, mode
    ("parallel": the masked product, "chunk": blockwise), chunk_size, dt_init_range (None: the
    forget gates' bias at zero, fla's; (lo, hi): decay times 1 / hi to 1 / lo tokens at the
    start, the module docstring)."""

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
        dt_init_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        if dt_init_range is not None:
            dt_init_range = check_dt_range("dt_init_range", dt_init_range)
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
        self.dt_init_range = dt_init_range
        if dt_init_range is not None:
            self.init_gates()

    def init_gates(self) -> None:
        """Set the forget gates' bias from ``dt_init_range`` (zero without one)."""
        _init_forget_bias(self.f_proj, self.dt_init_range)

    @classmethod
    def from_config(cls, config: LMConfig) -> ForgettingAttentionMixer:
        """The mixer of ``LMConfig.mixers`` name ``"forgetting"``: this attention with a KV cache,
        ``ForgettingAttentionMixer.from_config(config)`` (this layer has none)."""
        return ForgettingAttentionMixer.from_config(config)

    def forward(self, x: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
        """x [B, T, hidden_size] -> y [B, T, hidden_size]; ``cu_seqlens`` for packed sequences
        (B = 1)."""
        d = self.head_dim
        q = self.q_proj(x).unflatten(-1, (-1, d))
        k = self.k_proj(x).unflatten(-1, (-1, d))
        v = self.v_proj(x).unflatten(-1, (-1, d))
        log_f = F.logsigmoid(self.f_proj(x).to(compute_dtype(x.dtype))).to(q.dtype)
        o = forgetting_attention(q, k, v, log_f, window_size=self.window_size,
                                 cu_seqlens=cu_seqlens, mode=self.mode,
                                 chunk_size=self.chunk_size)  # fmt: skip
        o = o.flatten(-2)
        if self.use_output_gate:
            o = self.g_proj(x).sigmoid() * o
        return self.o_proj(o)


class ForgettingAttentionMixer(TokenMixer):
    """FoX attention (Lin et al., 2025) with a KV cache, for ``linattn.models.CausalLM``:

        o_t = sum_{s <= t} softmax_s(scale q_t^T k_s + G_t - G_s) v_s,   G_t = sum_{i <= t} log f_i,
        log f_t = logsigmoid(f_proj x_t) (one gate per head),  y = o_proj(sigmoid(g_proj x) * o)

    (the output gate optional; no positional embedding, as FoX). Args: d_model, n_heads,
    head_dim (default d_model // n_heads), num_kv_heads (default n_heads; a divisor of it:
    grouped heads), use_output_gate (False, fla's), chunk_size (the op's blocks), dt_init_range
    (None: the forget gates' bias at zero; (lo, hi): ``ForgettingAttention``'s). A prompt runs
    ``linattn.ops.softmax_variants.forgetting_attention`` (its chunk form, or the parallel one
    with ``mode = "parallel"``); tokens after a cached prefix attend to the cache and to each
    other causally with the cached G.
    """

    growing = ("k", "v", "G")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        num_kv_heads: int | None = None,
        use_output_gate: bool = False,
        chunk_size: int = 64,
        dt_init_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(d_model, chunk_size)
        if dt_init_range is not None:
            dt_init_range = check_dt_range("dt_init_range", dt_init_range)
        D = resolve_head_dim(d_model, n_heads, head_dim)
        kv_heads = resolve_kv_heads(n_heads, num_kv_heads)
        self.n_heads, self.num_kv_heads, self.head_dim = n_heads, kv_heads, D
        self.use_output_gate = flag("use_output_gate", use_output_gate)
        self.q_proj = nn.Linear(d_model, n_heads * D, bias=False)
        self.k_proj = nn.Linear(d_model, kv_heads * D, bias=False)
        self.v_proj = nn.Linear(d_model, kv_heads * D, bias=False)
        self.f_proj = nn.Linear(d_model, n_heads, bias=True)
        self.g_proj = nn.Linear(d_model, n_heads * D, bias=False) if self.use_output_gate else None
        self.o_proj = nn.Linear(n_heads * D, d_model, bias=False)
        self.dt_init_range = dt_init_range
        if dt_init_range is not None:
            self.init_gates()

    def init_gates(self) -> None:
        """Set the forget gates' bias from ``dt_init_range`` (zero without one)."""
        _init_forget_bias(self.f_proj, self.dt_init_range)

    @classmethod
    def from_config(cls, config: LMConfig) -> ForgettingAttentionMixer:
        """The layer of ``LMConfig.mixers`` name ``"forgetting"``: the config's ``head_dim``,
        ``num_key_value_heads``, ``output_gate`` (None: off, fla's default), ``chunk_size`` and
        ``dt_init_range`` (None: the zero bias)."""
        kwargs = dict(head_dim=config.head_size, num_kv_heads=config.num_key_value_heads,
                      use_output_gate=bool(config.output_gate), **dt_options(config))  # fmt: skip
        if config.chunk_size is not None:
            kwargs["chunk_size"] = config.chunk_size
        return cls(config.d_model, config.n_heads, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``k``, ``v``: [B, t, H_kv, D] in the model's dtype; ``G``: [B, t, H], the running sums
        of the log forget gates, in float32 (float64 for a float64 model); t = 0 at first."""
        kv = (batch_size, 0, self.num_kv_heads, self.head_dim)
        return {"k": (kv, dtype), "v": (kv, dtype),
                "G": ((batch_size, 0, self.n_heads), compute_dtype(dtype))}  # fmt: skip

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        HQ, H, D = self.n_heads, self.num_kv_heads, self.head_dim
        cd = compute_dtype(x.dtype)
        q = self.q_proj(x).view(B, T, HQ, D)
        k, v = self.k_proj(x).view(B, T, H, D), self.v_proj(x).view(B, T, H, D)
        log_f = F.logsigmoid(self.f_proj(x).to(cd))  # [B, T, HQ]
        cached = 0 if state is None else state["k"].shape[1]
        if cached == 0:
            mode = "parallel" if self.mode == "parallel" else "chunk"
            o = forgetting_attention(q, k, v, log_f.to(q.dtype), mode=mode,
                                     chunk_size=self.chunk_size).to(cd)  # fmt: skip
        new = None
        if state is not None:
            last = state["G"][:, -1:] if cached else log_f.new_zeros(B, 1, HQ)
            G = torch.cat([state["G"], last + log_f.cumsum(1)], 1)
            new = {"k": torch.cat([state["k"], k], 1), "v": torch.cat([state["v"], v], 1), "G": G}
            if cached:
                o = self._attend_cache(q, new, cached)
        o = o.reshape(B, T, HQ * D)
        if self.g_proj is not None:
            o = torch.sigmoid(self.g_proj(x).to(cd)) * o
        return self.o_proj(o.to(x.dtype)), new

    def _attend_cache(self, q: Tensor, cache: State, cached: int) -> Tensor:
        """The T new queries (positions cached .. cached + T - 1) over the whole cache, causal:
        softmax_s(scale q_t . k_s + G_t - G_s), s <= t. Returns [B, T, HQ, D] in the compute
        dtype."""
        cd = compute_dtype(q.dtype)
        T, group = q.shape[1], self.n_heads // self.num_kv_heads
        keys = cache["k"].to(cd).repeat_interleave(group, dim=2)  # [B, S, HQ, D]
        values = cache["v"].to(cd).repeat_interleave(group, dim=2)
        G = cache["G"]  # [B, S, HQ]
        logits = torch.einsum("bthd,bshd->bhts", q.to(cd), keys) * self.head_dim**-0.5
        logits = logits + G[:, cached:].transpose(1, 2)[..., None] - G.transpose(1, 2)[:, :, None]
        S = keys.shape[1]
        rows = torch.arange(cached, cached + T, device=q.device)[:, None]
        future = torch.arange(S, device=q.device)[None, :] > rows  # [T, S]
        weights = logits.masked_fill(future, float("-inf")).softmax(-1)
        return torch.einsum("bhts,bshd->bthd", weights, values)
