"""The CyclicFlowAttention (CyFA) layer as fla 0.6.0 defines it
(``fla.layers.CyclicFlowAttention``), around ``linattn.ops.cyfa``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype
from linattn.layers.modules import GatedRMSNorm, ShortConvolution
from linattn.ops.cyfa import cyfa


class CyclicFlowAttention(TokenMixer):
    """CyFA's layer (fla 0.6.0's ``CyclicFlowAttention``; the op ``linattn.ops.cyfa.cyfa``):

        q, k, v = conv(W_q x), conv(W_k x), conv(W_v x)     (short convolutions, no activation)
        g       = -exp(A_log) softplus(a_proj x + dt_bias)   (one log-decay per head)
        delta   = sigmoid(d_proj x)  (x detached, as fla)   beta = sigmoid(b_proj x)
        o       = cyfa(q, k, v, g, delta, beta, readout, q_norm.weight, k_norm.weight)
        y       = o_proj(rmsnorm(P o) * o_norm.weight * sigmoid(g_proj x))

    with P = num_slots - 1 readout rows (fla scales o by P before the norm). The parameters have
    fla's names and shapes, so ``from_fla`` loads fla's state dict as it is. The state holds the
    three convolutions' last inputs and CyFA's key memory, value memory and clock.

    Args (fla's names in brackets): d_model [hidden_size]; n_heads [num_heads]; head_dim
    (default 256, fla's); expand_k, expand_v (1.0); num_slots M (even, default 128); short_conv
    [use_short_conv] (True); conv_size (4); norm_eps (1e-5); chunk_size (64).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        head_dim: int = 256,
        *,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        num_slots: int = 128,
        short_conv: bool = True,
        conv_size: int = 4,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        for name, value in (("n_heads", n_heads), ("head_dim", head_dim), ("conv_size", conv_size)):
            check_positive(name, value)
        K, V = round(head_dim * expand_k), round(head_dim * expand_v)
        if (
            K < 1
            or V < 1
            or abs(K - head_dim * expand_k) > 1e-9
            or abs(V - head_dim * expand_v) > 1e-9
        ):
            raise ValueError(
                f"head_dim * expand_k and head_dim * expand_v must be whole numbers >= 1, got "
                f"{head_dim} * {expand_k} and {head_dim} * {expand_v}"
            )
        if (
            isinstance(num_slots, bool)
            or not isinstance(num_slots, int)
            or num_slots < 2
            or num_slots % 2
        ):
            raise ValueError(f"num_slots must be a positive even integer, got {num_slots!r}")
        if not isinstance(short_conv, bool):
            raise TypeError(f"short_conv must be a bool, got {type(short_conv).__name__}")
        H, P = n_heads, num_slots - 1
        self.n_heads, self.key_dim, self.head_dim, self.num_slots = H, K, V, num_slots
        self.short_conv, self.conv_size, self.norm_eps = short_conv, conv_size, float(norm_eps)
        self.q_proj = nn.Linear(d_model, H * K, bias=False)
        self.k_proj = nn.Linear(d_model, H * K, bias=False)
        self.v_proj = nn.Linear(d_model, H * V, bias=False)
        self.a_proj = nn.Linear(d_model, H, bias=False)
        dt = torch.exp(
            torch.rand(H) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(1e-3)))
        )
        dt = (dt * 1e-3).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.d_proj = nn.Linear(d_model, H, bias=True)
        self.b_proj = nn.Linear(d_model, H, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(0.0, 16.0)))
        self.readout = nn.Parameter(torch.eye(P).expand(H, P, P).clone())
        self.q_norm = nn.RMSNorm(K, eps=norm_eps)  # its weight (and eps) go to the op
        self.k_norm = nn.RMSNorm(K, eps=norm_eps)
        if short_conv:
            self.q_conv1d = ShortConvolution(H * K, conv_size, activation=None)
            self.k_conv1d = ShortConvolution(H * K, conv_size, activation=None)
            self.v_conv1d = ShortConvolution(H * V, conv_size, activation=None)
        self.g_proj = nn.Sequential(nn.Linear(d_model, V, bias=False), nn.Linear(V, H * V))
        self.o_norm = GatedRMSNorm(V, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        B, H, K, V, M = batch_size, self.n_heads, self.key_dim, self.head_dim, self.num_slots
        sd = state_dtype(dtype)
        spec = {"Hk": ((B, H, K, M), sd), "Hv": ((B, H, M, V), sd), "lambda": ((B, H), sd)}
        if self.short_conv:
            for name, width in (("conv_q", H * K), ("conv_k", H * K), ("conv_v", H * V)):
                spec[name] = ((B, width, self.conv_size - 1), dtype)
        return spec

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.head_dim
        mode = self.pick_mode(T, state)
        new: State = {}
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.short_conv:
            convs = (
                ("conv_q", self.q_conv1d),
                ("conv_k", self.k_conv1d),
                ("conv_v", self.v_conv1d),
            )
            outs = []
            for (name, conv), t in zip(convs, (q, k, v), strict=True):
                y, new[name] = conv(t, None if state is None else state[name])
                outs.append(y)
            q, k, v = outs
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        cd = state_dtype(x.dtype)  # fla's float32; float64 for a float64 layer
        g = -self.A_log.to(cd).exp() * F.softplus(self.a_proj(x).to(cd) + self.dt_bias.to(cd))
        delta = torch.sigmoid(self.d_proj(x.detach()).to(cd))
        beta = torch.sigmoid(self.b_proj(x).to(cd))
        S0 = None if state is None else (state["Hk"], state["Hv"], state["lambda"])
        o, S = cyfa(
            q, k, v, g, delta, beta, self.readout,
            self.q_norm.weight, self.k_norm.weight, q_norm_eps=self.q_norm.eps or 0.0,
            k_norm_eps=self.k_norm.eps or 0.0, scale=K**-0.5, mode=mode,
            chunk_size=self.chunk_size, initial_state=S0, output_final_state=state is not None,
        )  # fmt: skip
        gate = self.g_proj(x).view(B, T, H, V)
        y = self.o_proj(self.o_norm(o * (self.num_slots - 1), gate).reshape(B, T, H * V))
        if state is None:
            return y, None
        new.update(Hk=S[0], Hv=S[1], **{"lambda": S[2]})
        return y, new

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> CyclicFlowAttention:
        """Our layer with the options and weights of fla's ``fla.layers.CyclicFlowAttention``
        (its parameters have the same names and shapes; a convolution bias is refused)."""
        if type(module).__name__ != "CyclicFlowAttention":
            raise TypeError(
                f"module must be fla's CyclicFlowAttention, got {type(module).__name__}"
            )
        if module.use_short_conv and module.conv_bias:
            raise ValueError("fla's layer has conv_bias=True; linattn's convolutions have no bias")
        layer = cls(
            module.hidden_size, module.num_heads, module.head_dim, expand_k=module.expand_k,
            expand_v=module.expand_v, num_slots=module.num_slots,
            short_conv=module.use_short_conv, conv_size=module.conv_size,
            norm_eps=module.o_norm.eps, **kwargs,
        )  # fmt: skip
        layer.q_norm.eps, layer.k_norm.eps = module.q_norm.eps, module.k_norm.eps
        layer.load_state_dict(module.state_dict())
        return layer.to(next(module.parameters()).dtype)
