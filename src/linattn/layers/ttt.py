"""Layers of the test-time-training memories: ``TTTLinear`` (Sun et al., 2024) and ``Titans``
(Behrouz, Zhong and Mirrokni, 2024), around ``linattn.ops.ttt.ttt_linear`` and
``linattn.ops.titans.titans_linear``. fla 0.6.0 has the ops (``fla.ops.ttt``, ``fla.ops.titans``)
and no layer for either, so there is no ``from_fla``; the block is the one of linattn's
recurrent layers:

    q, k, v = conv(W_q x), conv(W_k x), conv(W_v x)    (one short convolution + SiLU; K = V = D)
    q, k    = q / |q|, k / |k|                          (Titans' section 4.4: l2-normalised)
    o       = the memory's op on q, k, v, its rates and its inner layer norm (w, b) [H, D]
    y       = o_proj(rmsnorm(o) * weight * silu(g_proj x))

The memory is trained by one gradient step per mini-batch of ``chunk_size`` tokens (each
token's gradient taken at the memory the mini-batch started from), so the mini-batch is part of
the method, not a tiling choice. For decoding, the state therefore keeps the memory at the
current mini-batch's start next to the running one, and ``offset`` [B] (int64), the number of
tokens seen: a prefill, or one token, in any pieces gives the outputs of one call on the whole
sequence. A call with a state steps the tokens that finish a started mini-batch one by one, runs
the op (chunk form) on the whole mini-batches that follow and steps the rest.
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
from linattn.layers.modules import GatedRMSNorm, ShortConvolution
from linattn.ops.checks import flag
from linattn.ops.titans import surprise, titans_linear
from linattn.ops.ttt import layer_norm, loss_gradient, ttt_linear


def _rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return float(value)


class _TestTimeTraining(TokenMixer):
    """Projections, convolution, inner layer norm, output norm and gate, and the mini-batch
    bookkeeping of a state; the subclasses give the memory (its rates, states, op and step)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        chunk_size: int = 16,
        short_conv: bool = True,
        conv_size: int = 4,
        output_gate: bool = True,
        inner_eps: float = 1e-6,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__(d_model, chunk_size)
        D = resolve_head_dim(d_model, n_heads, head_dim)
        check_positive("conv_size", conv_size)
        self.short_conv = flag("short_conv", short_conv)
        self.output_gate = flag("output_gate", output_gate)
        if isinstance(inner_eps, bool) or not isinstance(inner_eps, (int, float)) or inner_eps < 0:
            raise ValueError(f"inner_eps must be a number >= 0, got {inner_eps!r}")
        self.n_heads, self.head_dim, self.inner_eps = n_heads, D, float(inner_eps)
        H = n_heads
        self.q_proj = nn.Linear(d_model, H * D, bias=False)
        self.k_proj = nn.Linear(d_model, H * D, bias=False)
        self.v_proj = nn.Linear(d_model, H * D, bias=False)
        self.conv = ShortConvolution(3 * H * D, conv_size) if self.short_conv else None
        # the inner model's layer norm LN_{w,b}, one per head (TTT's and fla's ttt_norm)
        self.inner_norm_weight = nn.Parameter(torch.ones(H, D))
        self.inner_norm_bias = nn.Parameter(torch.zeros(H, D))
        self.g_proj = nn.Linear(d_model, H * D, bias=False) if self.output_gate else None
        self.o_norm = GatedRMSNorm(D, "silu", norm_eps)
        self.o_proj = nn.Linear(H * D, d_model, bias=False)

    # -- what the subclasses define ------------------------------------------------------------

    memories: tuple[str, ...] = ()  # the state's [B, H, rows, D] tensors, with their rows

    def memory_rows(self, name: str) -> int:
        return self.head_dim

    def rates(self, x: Tensor) -> dict[str, Tensor]:
        """The op's per-token rates from x: name -> [B, T, H, 1]."""
        raise NotImplementedError

    def run(self, q, k, v, rates, memory, mode) -> tuple[Tensor, dict[str, Tensor] | None]:
        """The op on whole mini-batches ([B, T, H, D] inputs) from ``memory`` (None: zeros)
        -> (o, the memory after them, or None without ``memory``)."""
        raise NotImplementedError

    def step(self, q, k, v, rates, memory, position) -> tuple[Tensor, dict[str, Tensor]]:
        """One token (head-first [B, H, 1, D], rates [B, H, 1, 1], in the compute dtype) at
        ``position`` in its mini-batch -> (z before the inner norm, the memory after it)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        B, H, D = batch_size, self.n_heads, self.head_dim
        sd = state_dtype(dtype)
        spec: StateSpec = {n: ((B, H, self.memory_rows(n), D), sd) for n in self.memories}
        spec["offset"] = ((B,), torch.int64)
        if self.conv is not None:
            spec["conv"] = (self.conv.state_shape(B), dtype)
        return spec

    def inner_norm(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The inner layer norm's (w, b) as [1, H, 1, D] in ``dtype``."""
        return (self.inner_norm_weight.to(dtype)[None, :, None, :],
                self.inner_norm_bias.to(dtype)[None, :, None, :])  # fmt: skip

    def _steps(self, q, k, v, rates, memory, offset) -> tuple[Tensor, dict[str, Tensor]]:
        """Token by token (the op's primal form, continued from a started mini-batch)."""
        cd = state_dtype(q.dtype)
        q, k, v = (t.to(cd).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        rates = {n: r.to(cd).transpose(1, 2) for n, r in rates.items()}
        outs = []
        for t in range(q.shape[2]):
            one = slice(t, t + 1)
            z, memory = self.step(q[:, :, one], k[:, :, one], v[:, :, one],
                                  {n: r[:, :, one] for n, r in rates.items()}, memory,
                                  (offset + t) % self.chunk_size)  # fmt: skip
            outs.append(z)
        z = torch.cat(outs, dim=2)
        o = z + layer_norm(z, *self.inner_norm(cd), self.inner_eps)
        return o.transpose(1, 2), memory

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        H, D, C = self.n_heads, self.head_dim, self.chunk_size
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        new: State | None = None if state is None else {}
        if self.conv is not None:
            qkv, conv_state = self.conv(qkv, None if state is None else state["conv"])
            if new is not None:
                new["conv"] = conv_state
        else:
            qkv = F.silu(qkv)
        q, k, v = (t.reshape(B, T, H, D) for t in qkv.split(H * D, dim=-1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        rates = self.rates(x)
        mode = self.pick_mode(T, state)
        if state is None:
            o, _ = self.run(q, k, v, rates, None, mode)
        else:
            offset = state["offset"]
            if bool((offset != offset[0]).any()):
                raise ValueError(
                    f"state['offset'] must be the same for every sequence, got {offset.tolist()}"
                )
            start = int(offset[0])
            memory = {n: state[n] for n in self.memories}
            head = min(T, (-start) % C)  # the tokens that finish a started mini-batch
            whole = (T - head) // C * C
            pieces = []
            parts = ((0, head, "step"), (head, head + whole, "run"), (head + whole, T, "step"))
            for a, c, how in parts:
                if c == a:
                    continue
                args = (q[:, a:c], k[:, a:c], v[:, a:c], {n: r[:, a:c] for n, r in rates.items()})
                if how == "run":
                    o_part, memory = self.run(*args, memory, mode)
                else:
                    o_part, memory = self._steps(*args, memory, start + a)
                pieces.append(o_part.to(x.dtype))
            o = torch.cat(pieces, dim=1)
            new.update({n: memory[n].to(state_dtype(x.dtype)) for n in self.memories})
            new["offset"] = offset + T
        gate = None if self.g_proj is None else self.g_proj(x).view(B, T, H, D)
        o = self.o_norm(o.to(x.dtype), gate)
        return self.o_proj(o.reshape(B, T, H * D)), new


class TTTLinear(_TestTimeTraining):
    """TTT-Linear (Sun et al., 2024, "Learning to (Learn at Test Time)", sections 2.1-2.7) on
    ``linattn.ops.ttt.ttt_linear`` (the module docstring):

        eta_t = base_lr sigmoid(lr_proj x_t) / D      (the paper's learnable learning rate)
        W_t = W_0 - eta_t sum_{s <= t} grad_W l_s(W_0, h_0)   within a mini-batch (h alike),
        o_t = z_t + LN_{w,b}(z_t),  z_t = (q_t / sqrt(D)) W_t + h_t,
        l_s = 1/2 |LN_{w,b}(k_s W + h) - (v_s - k_s)|^2

    State: ``W`` [B, H, D, D] and ``h`` [B, H, 1, D] at the current mini-batch's start, the
    running sums ``sum_W``, ``sum_h`` of its tokens' gradients, ``offset`` and ``conv``.

    Args: d_model; n_heads; head_dim (D, default d_model // n_heads); chunk_size (the
    mini-batch b, default 16); base_lr (1.0); short_conv (True); conv_size (4); output_gate
    (True); inner_eps (the inner layer norm's, 1e-6); norm_eps (the output norm's, 1e-6).
    """

    memories = ("W", "h", "sum_W", "sum_h")

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 base_lr: float = 1.0, **kwargs) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        self.base_lr = _rate("base_lr", base_lr)
        self.lr_proj = nn.Linear(d_model, n_heads, bias=True)

    def memory_rows(self, name: str) -> int:
        return 1 if name in ("h", "sum_h") else self.head_dim

    def rates(self, x: Tensor) -> dict[str, Tensor]:
        eta = self.base_lr * torch.sigmoid(self.lr_proj(x)) / self.head_dim
        return {"eta": eta.unsqueeze(-1)}

    def run(self, q, k, v, rates, memory, mode):
        initial = None if memory is None else (memory["W"], memory["h"])
        o, final = ttt_linear(
            q, k, v, self.inner_norm_weight, self.inner_norm_bias, rates["eta"],
            eps=self.inner_eps, mini_batch_size=self.chunk_size, mode=mode,
            initial_state=initial, output_final_state=memory is not None,
        )  # fmt: skip
        if memory is None:
            return o, None
        W, h = final  # whole mini-batches: no running sums left
        return o, {"W": W, "h": h, "sum_W": torch.zeros_like(W), "sum_h": torch.zeros_like(h)}

    def step(self, q, k, v, rates, memory, position):
        W, h = memory["W"].to(q.dtype), memory["h"].to(q.dtype)
        eta = rates["eta"]
        g = loss_gradient(k, v, W, h, *self.inner_norm(q.dtype), self.inner_eps)  # [B, H, 1, D]
        sum_W = memory["sum_W"].to(q.dtype) + k.transpose(-1, -2) @ g
        sum_h = memory["sum_h"].to(q.dtype) + g
        z = (q * self.head_dim**-0.5) @ (W - eta * sum_W) + h - eta * sum_h
        if position == self.chunk_size - 1:  # the mini-batch ends: its gradient step
            W, h = W - eta * sum_W, h - eta * sum_h
            sum_W, sum_h = torch.zeros_like(sum_W), torch.zeros_like(sum_h)
        return z, {"W": W, "h": h, "sum_W": sum_W, "sum_h": sum_h}


class Titans(_TestTimeTraining):
    """Titans' linear memory (Behrouz, Zhong and Mirrokni, 2024, "Titans: Learning to Memorize
    at Test Time", sections 3.1-3.2 and 4.4) on ``linattn.ops.titans.titans_linear`` (the module
    docstring):

        theta_t = base_lr sigmoid(theta_proj x_t),  alpha_t = sigmoid(alpha_proj x_t),
        eta_t = sigmoid(eta_proj x_t)        (learning rate, forgetting, momentum; per head)
        S_t = eta_t S_{t-1} - 2 theta_t k_t^T u_t(M'),   M_t = (1 - alpha_t) M_{t-1} + S_t,
        o_t = q_t M_t + LN_{w,b}(q_t M_t)

    with u_t the surprise (the loss gradient through the inner layer norm) at M', the memory at
    the start of the token's mini-batch. The forgetting and momentum biases start at -4 and 2
    (alpha ~ 0.02, eta ~ 0.9). State: ``M``, the momentum ``S`` and ``M_start`` (M'), [B, H, D, D]
    each, ``offset`` and ``conv``.

    Args: d_model; n_heads; head_dim (D, default d_model // n_heads); chunk_size (the
    mini-batch, default 16); base_lr (0.1); short_conv (True); conv_size (4); output_gate
    (True); inner_eps (1e-6); norm_eps (1e-6).
    """

    memories = ("M", "S", "M_start")

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 base_lr: float = 0.1, **kwargs) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        self.base_lr = _rate("base_lr", base_lr)
        self.theta_proj = nn.Linear(d_model, n_heads, bias=True)
        self.alpha_proj = nn.Linear(d_model, n_heads, bias=True)
        self.eta_proj = nn.Linear(d_model, n_heads, bias=True)
        with torch.no_grad():
            self.alpha_proj.bias.fill_(-4.0)
            self.eta_proj.bias.fill_(2.0)

    def rates(self, x: Tensor) -> dict[str, Tensor]:
        return {
            "theta": (self.base_lr * torch.sigmoid(self.theta_proj(x))).unsqueeze(-1),
            "alpha": torch.sigmoid(self.alpha_proj(x)).unsqueeze(-1),
            "eta": torch.sigmoid(self.eta_proj(x)).unsqueeze(-1),
        }

    def run(self, q, k, v, rates, memory, mode):
        initial = None if memory is None else (memory["M"], memory["S"])
        o, final = titans_linear(
            q, k, v, self.inner_norm_weight, self.inner_norm_bias, rates["theta"],
            rates["alpha"], rates["eta"], eps=self.inner_eps, chunk_size=self.chunk_size,
            mode=mode, initial_state=initial, output_final_state=memory is not None,
        )  # fmt: skip
        if memory is None:
            return o, None
        M, S = final  # whole mini-batches: the next one starts at M
        return o, {"M": M, "S": S, "M_start": M}

    def step(self, q, k, v, rates, memory, position):
        M, S, M_start = (memory[n].to(q.dtype) for n in self.memories)
        # every surprise of a mini-batch at its first memory
        u = surprise(k, v, M_start, *self.inner_norm(q.dtype), self.inner_eps)
        S = rates["eta"] * S - 2 * rates["theta"] * (k.transpose(-1, -2) @ u)
        M = (1 - rates["alpha"]) * M + S
        z = q @ M
        if position == self.chunk_size - 1:  # the next mini-batch starts here
            M_start = M
        return z, {"M": M, "S": S, "M_start": M_start}
