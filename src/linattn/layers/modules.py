"""The building blocks the mixers share: short convolution, gated per-head RMSNorm, decay gates,
the low-rank projection of the gates, RWKV's LoRA and token shift."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import check_positive
from linattn.ops.conv import short_conv
from linattn.ops.functional import decay_gate, l2norm

__all__ = [
    "DecayGate",
    "GatedRMSNorm",
    "LoRA",
    "ShortConvolution",
    "l2norm",
    "low_rank",
    "token_shift",
]


class ShortConvolution(nn.Module):
    """Causal depthwise convolution over time, then SiLU (Mamba, H3, DeltaNet, KDA).

    ``y[t, c] = silu(sum_{i < kernel} w[c, i] x[t - kernel + 1 + i, c])``, with ``x[s] = 0``
    before the first token (``activation=None``: without the SiLU). Its generation state is the
    last ``kernel - 1`` inputs, ``[B, channels, kernel - 1]``: calling it on a sequence in pieces
    of any lengths, passing the state along, gives the outputs of one call on the whole sequence.
    """

    def __init__(
        self, channels: int, kernel_size: int = 4, activation: str | None = "silu"
    ) -> None:
        super().__init__()
        check_positive("channels", channels)
        check_positive("kernel_size", kernel_size)
        if activation not in ("silu", None):
            raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
        self.channels = channels
        self.kernel_size = kernel_size
        self.activation = activation
        # weight: [channels, 1, kernel] (one filter per channel); same init as nn.Conv1d.
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def state_shape(self, batch_size: int) -> tuple[int, int, int]:
        """The generation state's shape, [B, channels, kernel - 1]: the last kernel - 1 inputs."""
        return batch_size, self.channels, self.kernel_size - 1

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: [B, T, C], state: [B, C, kernel - 1] or None (zeros) -> (y: [B, T, C], new state)."""
        state = None if state is None else state.to(x.dtype)
        weight = self.weight.to(x.dtype)[:, 0]  # [C, 1, kernel] -> [C, kernel]
        return short_conv(x, weight, state, self.activation)  # [B, T, C], [B, C, kernel - 1]


class GatedRMSNorm(nn.Module):
    """Per-head output norm and gate: ``o <- rmsnorm(o) * weight * act(gate)``.

    o, gate: [B, T, H, V]; the norm runs over each head's V channels with one weight of size V
    shared by the heads (as Gated DeltaNet and KDA do). ``act`` is ``"silu"`` (Gated DeltaNet,
    GLA) or ``"sigmoid"`` (KDA).
    """

    def __init__(self, head_dim: int, activation: str = "silu", eps: float = 1e-6) -> None:
        super().__init__()
        if activation not in ("silu", "sigmoid"):
            raise ValueError(f"activation must be 'silu' or 'sigmoid', got {activation!r}")
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.activation = activation
        self.eps = eps

    def forward(self, o: Tensor, gate: Tensor | None) -> Tensor:
        """``rmsnorm(o) * weight * act(gate)``; the norm alone when ``gate`` is None."""
        o = F.rms_norm(o, (o.shape[-1],), self.weight, self.eps)
        if gate is None:
            return o
        act = F.silu(gate) if self.activation == "silu" else torch.sigmoid(gate)
        return o * act


def low_rank(d_in: int, rank: int, d_out: int, bias: bool = False) -> nn.Sequential:
    """x -> W2 (W1 x) (+ b): the low-rank projection of GLA and KDA gates, d_in -> rank -> d_out."""
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=bias))


_LORA_ACTIVATIONS = {None: nn.Identity, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


class LoRA(nn.Module):
    """RWKV's low-rank projection: ``x -> up(act(down x)) + bias``, d_in -> rank -> d_out.

    ``act`` is ``None`` (identity), ``"tanh"`` or ``"sigmoid"`` (RWKV-7's decay and gate LoRAs).
    The bias is its own parameter, so that a model's init of its linear layers (zero biases)
    leaves the layer's chosen offset alone.
    """

    def __init__(
        self, d_in: int, rank: int, d_out: int, activation: str | None = None, bias: bool = True
    ) -> None:
        super().__init__()
        check_positive("rank", rank)
        if activation not in _LORA_ACTIVATIONS:
            raise ValueError(f"activation must be None, 'tanh' or 'sigmoid', got {activation!r}")
        self.down = nn.Linear(d_in, rank, bias=False)
        self.act = _LORA_ACTIVATIONS[activation]()
        self.up = nn.Linear(rank, d_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.up(self.act(self.down(x)))
        return y if self.bias is None else y + self.bias


def token_shift(
    x: Tensor, last: Tensor | None = None, cu_seqlens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RWKV's token shift: ``delta_t = x_{t-1} - x_t`` with ``x_0 = last`` (zeros when None).

    x: [B, T, D], last: [N, D] (the previous call's last token of each sequence) -> (delta
    [B, T, D], the new last [N, D]): feeding a sequence in pieces, passing the second result
    along, gives one call's deltas. N = B, or with ``cu_seqlens`` (B = 1, packed sequences) the
    number of sequences, each starting from its own row of ``last``; a sequence of length 0
    keeps its row (zeros when ``last`` is None).
    """
    if cu_seqlens is None and x.shape[1] > 0:  # one sequence per row, at least one token
        first = torch.zeros_like(x[:, :1]) if last is None else last.to(x.dtype).unsqueeze(1)
        shifted = torch.cat([first, x[:, :-1]], dim=1)  # [B, 1, D] + [B, T - 1, D] -> [B, T, D]
        return shifted - x, x[:, -1]
    B, T, D = x.shape
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"token_shift: x must have batch size 1 with cu_seqlens, got {B}")
    if cu_seqlens is None:
        starts = torch.zeros(B, dtype=torch.long)  # [N]: where each sequence begins
        ends = torch.full((B,), T, dtype=torch.long)
        rows = torch.arange(B)
    else:
        bounds = cu_seqlens.to("cpu", torch.long)
        starts, ends = bounds[:-1], bounds[1:]
        rows = torch.zeros_like(starts)
    N = starts.numel()
    first = x.new_zeros(N, D) if last is None else last.reshape(N, D).to(x.dtype)
    nonempty = ends > starts  # [N]
    previous = torch.cat([x.new_zeros(B, 1, D), x[:, :-1]], dim=1)  # [B, T, D]: x_{t-1}
    previous = previous.index_put((rows[nonempty], starts[nonempty]), first[nonempty])
    ends_of = x[rows[nonempty], ends[nonempty] - 1]  # [N', D]: each sequence's last token
    return previous - x, first.index_put((nonempty.nonzero().squeeze(1),), ends_of)


def check_dt_range(name: str, dt_range: object) -> tuple[float, float]:
    """A range of initial step sizes (lo, hi) with 0 < lo <= hi, finite; the argument named."""
    ok = isinstance(dt_range, tuple | list) and len(dt_range) == 2
    ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in dt_range)
    ok = ok and 0 < dt_range[0] <= dt_range[1] < math.inf
    if not ok:
        raise ValueError(f"{name} must be a pair (lo, hi) with 0 < lo <= hi, got {dt_range!r}")
    return float(dt_range[0]), float(dt_range[1])


class DecayGate(nn.Module):
    """Data-dependent log-decay ``g = log(alpha) <= 0``, per head or per key channel.

    - ``kind="scalar"`` (Mamba-2, Gated DeltaNet): one value per head, ``g: [B, T, H]``,
      ``g = -exp(A_log) * softplus(a_proj x + dt_bias)``. Initialisation as in Mamba-2:
      ``A_log = log(A)``, ``A ~ uniform(A_range)`` per head (Mamba-2: (1, 16); fla's Gated
      DeltaNet: (0, 16)); ``dt_bias = softplus^{-1}(dt)``, ``dt`` log-uniform in [0.001, 0.1],
      so that the initial step sizes ``softplus(dt_bias)`` span that range (``dt_range``: the
      initial decay per token is exp(-A dt), from about 0.98 to 0.2 with these ranges; few
      heads with a small model may all draw fast ones: ``LMConfig.dt_init_range``).
    - ``kind="channel"`` (KDA): the same formula per key channel, ``g: [B, T, H, K]``, with
      ``a_proj`` low-rank (d_model -> ``rank`` -> H*K), ``A_log`` per head and ``dt_bias`` per
      channel, initialised as above: fla 0.6.0's ``KimiDeltaAttention`` and transformers 5.23's
      ``KimiLinearForgetGate`` (its ``_init_weights``) both start ``dt_bias`` in Mamba-2's
      range and ``A`` in (1, 16).
    - ``kind="gla"`` (GLA): ``g = logsigmoid(a_proj x) / 16`` per key channel, ``a_proj``
      low-rank with bias (rank 16 in the paper); dividing by 16 keeps the initial decay near 1.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        key_dim: int,
        kind: str,
        rank: int = 16,
        A_range: tuple[float, float] = (1.0, 16.0),
        dt_range: tuple[float, float] = (1e-3, 1e-1),
    ) -> None:
        super().__init__()
        if kind not in ("scalar", "channel", "gla"):
            raise ValueError(f"kind must be 'scalar', 'channel' or 'gla', got {kind!r}")
        check_dt_range("dt_range", dt_range)
        self.kind, self.n_heads, self.key_dim = kind, n_heads, key_dim
        width = n_heads if kind == "scalar" else n_heads * key_dim
        if kind == "scalar":
            self.a_proj = nn.Linear(d_model, width, bias=False)
        else:
            self.a_proj = low_rank(d_model, rank, width, bias=(kind == "gla"))
        if kind != "gla":
            self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(*A_range)))
            dt = torch.exp(torch.empty(width).uniform_(*(math.log(x) for x in dt_range)))
            # inverse softplus: softplus(dt + log(1 - exp(-dt))) = dt
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, x: Tensor) -> Tensor:
        """x: [B, T, d_model] -> g: [B, T, H] (scalar) or [B, T, H, K] (channel, gla)."""
        B, T, _ = x.shape
        a = self.a_proj(x)  # [B, T, H] or [B, T, H*K]
        if self.kind == "gla":
            return (F.logsigmoid(a) / 16.0).view(B, T, self.n_heads, self.key_dim)
        if self.kind == "scalar":
            return decay_gate(a, self.A_log, self.dt_bias)  # [B, T, H]
        H, K = self.n_heads, self.key_dim
        # [B, T, H*K] -> [B, T, H, K]; A_log per head, dt_bias per channel
        return decay_gate(a.view(B, T, H, K), self.A_log[:, None], self.dt_bias.view(H, K))
