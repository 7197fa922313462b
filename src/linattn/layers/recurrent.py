"""``RecurrentMixer``: what every fixed-memory mixer builds around its op (spec sections 5, 7, 10).

    x -> q, k, v projections -> short convolution + SiLU -> [mixer: features / norms / gates]
      -> op (chunk for training and prefill, recurrent step for decoding) -> o
      -> per-head RMSNorm * act(output gate) (optional) -> output projection

The subclasses (``LinearAttention``, ``DeltaNet``, ``GatedDeltaNet``, ``KimiDeltaAttention``) only
say what differs: the transition and the write of the memory ``S_t = A_t S_{t-1} + k_t w_t^T``
(the mechanism table of docs/design.md), in ``recurrence``; and the memory's shape, in
``memory_shape``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import (
    State,
    StateSpec,
    TokenMixer,
    check_positive,
    resolve_head_dim,
    state_dtype,
)
from linattn.layers.modules import GatedRMSNorm, ShortConvolution, low_rank
from linattn.ops.checks import flag


class RecurrentMixer(TokenMixer):
    """Projections, short convolution, output gate and norm, state handling of a recurrent mixer.

    Args:
        d_model: width of the residual stream.
        n_heads: number of query/key heads H.
        head_dim: value dimension V per head (default ``d_model // n_heads``).
        key_dim: query/key dimension K per head, before any feature map (default ``head_dim``).
        num_v_heads: number of value heads HV, a multiple of H (default H). With HV = G H each
            query/key head serves G consecutive value heads (grouped value heads, Qwen3-Next's
            and fla's layout): the memory, the gates and the output have HV heads.
        short_conv: causal depthwise convolution (kernel ``conv_size``) + SiLU on q, k and v;
            without it, q, k and v go through SiLU alone.
        output_gate: multiply the normed output by ``act(g_proj x)`` (default); False keeps the
            per-head RMSNorm alone (DeltaNet's original layer; Zoology's MQAR models).
        gate_activation: ``"silu"`` or ``"sigmoid"`` for the output gate.
        gate_rank: ``None`` for a full output-gate projection, an int for a low-rank one
            (KDA: d_model -> rank -> HV*V).
        gate_bias: a bias on the output gate's (last) projection.
        chunk_size: block length C of the chunk form.
        norm_eps: epsilon of the output RMSNorm.
        writes: rows of k and v per token (DeltaProduct's n_h; default 1): the k and v
            projections (and their convolution channels) are ``writes`` times wider, laid out
            [write, head, channel] as fla's, and k, v enter the op with T ``writes`` rows.
    """

    # Without the short convolution, q, k and v still go through its SiLU (DeltaNet, Gated
    # DeltaNet); False: they enter the op as projected (GLA without convolution, as fla's).
    silu_without_conv: bool = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        num_v_heads: int | None = None,
        short_conv: bool = True,
        conv_size: int = 4,
        output_gate: bool = True,
        gate_activation: str = "silu",
        gate_rank: int | None = None,
        gate_bias: bool = False,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
        writes: int = 1,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("writes", writes)
        short_conv, output_gate = flag("short_conv", short_conv), flag("output_gate", output_gate)
        gate_bias = flag("gate_bias", gate_bias)
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        key_dim = head_dim if key_dim is None else key_dim
        check_positive("key_dim", key_dim)
        HV = n_heads if num_v_heads is None else num_v_heads
        check_positive("num_v_heads", HV)
        if HV % n_heads:
            raise ValueError(f"num_v_heads ({HV}) must be a multiple of n_heads ({n_heads})")
        H, K, V = n_heads, key_dim, head_dim
        self.n_heads, self.num_v_heads, self.key_dim, self.head_dim = H, HV, K, V
        self.writes = n = writes
        self.q_proj = nn.Linear(d_model, H * K, bias=False)
        self.k_proj = nn.Linear(d_model, n * H * K, bias=False)
        self.v_proj = nn.Linear(d_model, n * HV * V, bias=False)
        # One depthwise convolution over [q | k | v] is three per-channel convolutions.
        channels = (n + 1) * H * K + n * HV * V
        self.conv = ShortConvolution(channels, conv_size) if short_conv else None
        self.g_proj: nn.Module | None = None
        if output_gate:
            if gate_rank is None:
                self.g_proj = nn.Linear(d_model, HV * V, bias=gate_bias)
            else:
                self.g_proj = low_rank(d_model, gate_rank, HV * V, bias=gate_bias)
        self.o_norm = GatedRMSNorm(V, gate_activation, norm_eps)
        self.o_proj = nn.Linear(HV * V, d_model, bias=False)

    # -- what the subclasses define ------------------------------------------------------------

    def memory_shape(self) -> tuple[int, int]:
        """(rows, columns) of one head's memory S: (K, V), unless features or a normaliser widen
        it."""
        return self.key_dim, self.head_dim

    def recurrence(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mode: str, S: Tensor | None, keep: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Run the op: q, k [B, T, H, K], v [B, T, HV, V] (k, v: T ``writes`` rows), S the
        initial memory
        [B, HV, *memory_shape] or None -> (o [B, T, HV, V], final memory if ``keep`` else None).
        ``x`` feeds the gates."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------

    def extra_states(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        """The shapes of the mixer's states besides the memory S (a preconditioner's, ...): none
        by default. A mixer with some receives and returns, in ``recurrence``, the dict of all
        its states (``{"S": ..., **extra}``) instead of S alone."""
        return {}

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, HV, rows, cols] in float32 (float64 for float64 models); ``conv``: the last
        ``conv_size - 1`` inputs of the short convolution, [B, (n + 1) HK + n HV V, conv_size - 1]
        (n = ``writes``); the ``extra_states``, in S's dtype."""
        spec: StateSpec = {
            "S": ((batch_size, self.num_v_heads, *self.memory_shape()), state_dtype(dtype))
        }
        for name, shape in self.extra_states(batch_size).items():
            spec[name] = (shape, state_dtype(dtype))
        if self.conv is not None:
            spec["conv"] = (self.conv.state_shape(batch_size), dtype)
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, HV, K, V = self.n_heads, self.num_v_heads, self.key_dim, self.head_dim
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)  # [B, T, C]
        new_state: State | None = None if state is None else {}
        if self.conv is not None:
            qkv, conv_state = self.conv(qkv, None if state is None else state["conv"])
            if new_state is not None:
                new_state["conv"] = conv_state
        elif self.silu_without_conv:
            qkv = F.silu(qkv)
        n = self.writes
        q, k, v = qkv.split([H * K, n * H * K, n * HV * V], dim=-1)
        q = q.view(B, T, H, K)  # [B, T, H*K] -> [B, T, H, K]
        # [B, T, n*H*K] -> [B, T n, H, K]: the n writes of token t are rows t n .. t n + n - 1
        k = k.reshape(B, T * n, H, K)
        v = v.reshape(B, T * n, HV, V)  # [B, T, n*HV*V] -> [B, T n, HV, V]
        mode = self.pick_mode(T, state)
        S = None if state is None else state["S"]
        extra = self.extra_states(B)
        if extra and state is not None:
            S = {"S": S, **{name: state[name] for name in extra}}
        o, S = self.recurrence(x, q, k, v, mode, S, keep=state is not None)
        if new_state is not None:
            for name, t in (S if isinstance(S, dict) else {"S": S}).items():
                # an integer state (a position) keeps its dtype
                new_state[name] = t.to(state_dtype(x.dtype)) if t.is_floating_point() else t
        gate = None
        if self.g_proj is not None:
            gate = self.g_proj(x).view(B, T, HV, V)  # [B, T, HV*V] -> [B, T, HV, V]
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, HV * V)), new_state  # [B, T, HV, V] -> [B, T, HV*V]
