"""The scaffolding every token mixer shares: short convolution, gated per-head RMSNorm, decay gates.

A token mixer maps ``x: [B, T, d_model]`` to ``y: [B, T, d_model]``. For generation it also takes
and returns a *state*: a dict of tensors whose sizes are fixed for the recurrent mixers (spec
sections 5 and 9) and grow with t only for softmax attention's KV cache.

``TokenMixer`` is the base class: it validates the input, holds the state specification
(``state_spec``), allocates empty states (``new_state``), and picks the op's mode: ``"chunk"`` for
training and prefill, ``"recurrent"`` for a one-token decoding step with a state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.dtypes import compute_dtype

State = dict[str, Tensor]
# name -> (shape, dtype); a 0 on axis 1 of a name listed in ``TokenMixer.growing`` is the time axis.
StateSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """States accumulate in float32, or in float64 when the model is float64 (DESIGN.md)."""
    return compute_dtype(dtype)


def check_positive(name: str, value: int) -> None:
    """A ValueError naming ``name`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def resolve_head_dim(d_model: int, n_heads: int, head_dim: int | None) -> int:
    """``head_dim``, or d_model / n_heads when None (d_model must then be divisible), checked."""
    check_positive("n_heads", n_heads)
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        head_dim = d_model // n_heads
    check_positive("head_dim", head_dim)
    return head_dim


class TokenMixer(nn.Module):
    """Base of every mixer: ``forward(x, state=None) -> (y, new_state)``.

    Subclasses set ``d_model`` and implement ``mix`` and ``state_spec``. ``growing`` names the state
    tensors whose axis 1 is time (softmax attention's keys and values); all others are fixed-size.
    Setting ``mixer.mode`` to ``"parallel"``, ``"recurrent"`` or ``"chunk"`` forces one form of the
    op (for cross-checks); ``None``, the default, lets ``pick_mode`` choose.
    """

    growing: tuple[str, ...] = ()

    def __init__(self, d_model: int, chunk_size: int = 64) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("chunk_size", chunk_size)
        self.d_model = d_model
        self.chunk_size = chunk_size
        # None: chunk for T > 1 or without state, recurrent for a one-token step with state.
        self.mode: str | None = None

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """Shapes and dtypes of the generation state of this mixer (before any token)."""
        raise NotImplementedError

    def new_state(
        self, batch_size: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> State:
        """Zero state for ``batch_size`` sequences: what the mixer holds before the first token."""
        spec = self.state_spec(batch_size, dtype)
        return {
            name: torch.zeros(shape, dtype=dt, device=device) for name, (shape, dt) in spec.items()
        }

    def pick_mode(self, T: int, state: State | None) -> str:
        """The op's mode: recurrent for a decoding step (T = 1 with a state), chunk otherwise."""
        if self.mode is not None:
            return self.mode
        return "recurrent" if (T == 1 and state is not None) else "chunk"

    def forward(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State | None]:
        """x: [B, T, d_model] -> (y: [B, T, d_model], the advanced state or None without one)."""
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape [B, T, {self.d_model}], got {shape}")
        if x.shape[1] < 1:
            raise ValueError("x must hold at least one token (T >= 1)")
        if state is not None:
            self.check_state(state, x.shape[0], x.dtype)
        return self.mix(x, state)

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        raise NotImplementedError

    def check_state(self, state: State, batch_size: int, dtype: torch.dtype) -> None:
        """A ValueError naming the first state tensor whose name, shape or dtype is unexpected."""
        spec = self.state_spec(batch_size, dtype)
        if not isinstance(state, dict) or set(state) != set(spec):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"state must hold the tensors {sorted(spec)}, got {got}")
        for name, (shape, dt) in spec.items():
            tensor = state[name]
            if not isinstance(tensor, Tensor):
                raise ValueError(f"state[{name!r}] must be a tensor, got {type(tensor).__name__}")
            got = list(tensor.shape)
            want = list(shape)
            if name in self.growing and len(got) == len(want):
                want[1] = got[1]  # any number of cached tokens
            if got != want:
                raise ValueError(
                    f"state[{name!r}] has shape {got}, expected {want} (batch size {batch_size}); "
                    "was the state made for another model or batch size?"
                )
            if tensor.dtype != dt:
                raise ValueError(f"state[{name!r}] has dtype {tensor.dtype}, expected {dt}")


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

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: [B, T, C], state: [B, C, kernel - 1] or None (zeros) -> (y: [B, T, C], new state)."""
        B, T, C = x.shape
        x = x.transpose(1, 2)  # [B, C, T]
        if state is None:
            state = x.new_zeros(B, C, self.kernel_size - 1)
        padded = torch.cat([state.to(x.dtype), x], dim=2)  # [B, C, kernel - 1 + T]
        y = F.conv1d(padded, self.weight.to(x.dtype), groups=C)  # [B, C, T]
        new_state = padded[:, :, padded.shape[2] - (self.kernel_size - 1) :]
        y = F.silu(y) if self.activation == "silu" else y
        return y.transpose(1, 2), new_state


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


class DecayGate(nn.Module):
    """Data-dependent log-decay ``g = log(alpha) <= 0``, per head or per key channel.

    - ``kind="scalar"`` (Mamba-2, Gated DeltaNet): one value per head, ``g: [B, T, H]``,
      ``g = -exp(A_log) * softplus(a_proj x + dt_bias)``. Initialisation as in Mamba-2:
      ``A_log = log(A)``, ``A ~ uniform(1, 16)`` per head; ``dt_bias = softplus^{-1}(dt)``, ``dt``
      log-uniform in [0.001, 0.1], so that the initial step sizes ``softplus(dt_bias)`` span
      that range.
    - ``kind="channel"`` (KDA): the same formula per key channel, ``g: [B, T, H, K]``, with
      ``a_proj`` low-rank (d_model -> ``rank`` -> H*K), ``A_log`` per head and ``dt_bias`` per
      channel, initialised as above (Kimi Linear starts ``dt_bias`` at 0; we use the Mamba-2
      range for both).
    - ``kind="gla"`` (GLA): ``g = logsigmoid(a_proj x) / 16`` per key channel, ``a_proj``
      low-rank with bias (rank 16 in the paper); dividing by 16 keeps the initial decay near 1.
    """

    def __init__(self, d_model: int, n_heads: int, key_dim: int, kind: str, rank: int = 16) -> None:
        super().__init__()
        if kind not in ("scalar", "channel", "gla"):
            raise ValueError(f"kind must be 'scalar', 'channel' or 'gla', got {kind!r}")
        self.kind, self.n_heads, self.key_dim = kind, n_heads, key_dim
        width = n_heads if kind == "scalar" else n_heads * key_dim
        if kind == "scalar":
            self.a_proj = nn.Linear(d_model, width, bias=False)
        else:
            self.a_proj = low_rank(d_model, rank, width, bias=(kind == "gla"))
        if kind != "gla":
            self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(1.0, 16.0)))
            dt = torch.exp(torch.empty(width).uniform_(math.log(1e-3), math.log(1e-1)))
            # inverse softplus: softplus(dt + log(1 - exp(-dt))) = dt
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, x: Tensor) -> Tensor:
        """x: [B, T, d_model] -> g: [B, T, H] (scalar) or [B, T, H, K] (channel, gla)."""
        B, T, _ = x.shape
        a = self.a_proj(x)  # [B, T, H] or [B, T, H*K]
        if self.kind == "gla":
            return (F.logsigmoid(a) / 16.0).view(B, T, self.n_heads, self.key_dim)
        g = F.softplus(a + self.dt_bias)
        if self.kind == "scalar":
            return -torch.exp(self.A_log) * g  # [B, T, H]
        g = g.view(B, T, self.n_heads, self.key_dim)  # [B, T, H, K]
        return -torch.exp(self.A_log)[:, None] * g
