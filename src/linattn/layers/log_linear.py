"""``LogLinearMamba2``: Mamba-2 with log-linear attention's Fenwick levels (Guo, Yang et al. 2025,
"Log-Linear Attention"; fla 0.6.0's ``fla.layers.LogLinearMamba2``).

    [z | x B C | dt | dl] = in_proj(u)                   (dl: one weight logit per head and level)
    x, B, C = silu(conv(x B C) + b);  dt_t = softplus(dt_t + dt_bias);  A = -exp(A_log)
    lambda_t^(l) = softplus(L_l dl_t^(l))                 (L [H, levels], initialised to ones)
    y = log-linear attention (q = C, k = B, v = dt x, g = dt A, lambda, scale 1) + D x
    out = out_proj(rmsnorm(y * silu(z)))

The mixer is linattn's ``Mamba2`` with the scalar-decay memory replaced by
``linattn.ops.log_linear_attention`` (B and C shared by the ``H / n_groups`` heads of a group, as
its grouped heads), and fla's number of levels: ``num_levels`` = 15, every level of a sequence of
16,384 tokens. Generation state: ``S`` [B, num_levels - 1, H, N, P], the level states a token can
read (a level >= num_levels weighs 0, so the levels above are dropped exactly), ``offset`` [B]
(int64), the position of the next token, and ``conv``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.mamba2 import Mamba2
from linattn.layers.mixer import State, StateSpec, check_positive, state_dtype
from linattn.ops.log_linear import LogLinearState

NUM_LEVELS = 15  # fla's: ceil(log2(16384)) + 1


class LogLinearMamba2(Mamba2):
    """Log-linear Mamba-2; x, y: [B, T, d_model]. The arguments are ``Mamba2``'s, plus
    ``num_levels``: the Fenwick levels weighted per token and head (fla's 15)."""

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        head_dim: int = 64,
        n_groups: int = 1,
        *,
        num_levels: int = NUM_LEVELS,
        **kwargs: object,
    ) -> None:
        super().__init__(d_model, d_state, d_conv, expand, head_dim, n_groups, **kwargs)
        check_positive("num_levels", num_levels)
        self.num_levels = num_levels
        H = self.n_heads
        base = self.in_proj
        self.in_proj = nn.Linear(d_model, base.out_features + H * num_levels,
                                 bias=base.bias is not None)  # fmt: skip
        self.L = nn.Parameter(torch.ones(H, num_levels))

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: the level states [B, num_levels - 1 (at least 1), H, N, P] in float32 (float64
        for float64 models); ``offset``: [B] int64; ``conv`` as ``Mamba2``'s."""
        H, N, P = self.n_heads, self.d_state, self.head_dim
        levels = max(self.num_levels - 1, 1)
        return {
            "S": ((batch_size, levels, H, N, P), state_dtype(dtype)),
            "offset": ((batch_size,), torch.int64),
            "conv": (self.conv.state_shape(batch_size), dtype),
        }

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        Bsz, T, _ = x.shape
        H, N, P, G, Lv = self.n_heads, self.d_state, self.head_dim, self.n_groups, self.num_levels
        z, xBC, dt, dl = self.in_proj(x).split([self.d_inner, self.conv_dim, H, H * Lv], dim=-1)
        xBC, conv_state = self.conv(xBC, None if state is None else state["conv"])
        if self.conv_bias is not None:
            xBC = xBC + self.conv_bias
        xs, B, C = F.silu(xBC).split([self.d_inner, G * N, G * N], dim=-1)
        xs = xs.reshape(Bsz, T, H, P)
        B, C = B.reshape(Bsz, T, G, N), C.reshape(Bsz, T, G, N)  # grouped heads of the op
        dt = self.step_size(dt)  # [B, T, H]
        g = dt * -torch.exp(self.A_log.to(dt.dtype))
        lam = F.softplus(self.L.to(dt.dtype) * dl.reshape(Bsz, T, H, Lv).to(dt.dtype))
        start = None if state is None else LogLinearState(state["S"], state["offset"])
        y, final = ops.log_linear_attention(
            C, B, xs * dt[..., None].to(xs.dtype), g, lam.to(xs.dtype), scale=1.0,
            mode=self.pick_mode(T, state), chunk_size=self.chunk_size, initial_state=start,
            output_final_state=state is not None,
        )  # fmt: skip
        D = self.D.view(H, P) if self.D_has_hdim else self.D[:, None]
        y = (y + D * xs).reshape(Bsz, T, self.d_inner)
        y = y * F.silu(z) if self.norm is None else self.norm(y, z)
        new_state = None
        if state is not None:
            levels = state["S"].shape[1]
            S = final.S[:, :levels]  # the levels >= num_levels are never read: dropped exactly
            if S.shape[1] < levels:
                S = torch.cat([S, S.new_zeros(Bsz, levels - S.shape[1], *S.shape[2:])], 1)
            new_state = {"S": S.to(state["S"].dtype), "offset": final.offset, "conv": conv_state}
        return self.out_proj(y), new_state
