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

``LogLinearGatedDeltaNet``: Gated DeltaNet's layer (``linattn.layers.GatedDeltaNet``) with the same
Fenwick levels over its memory (the paper's section 3.4): the writes are Gated DeltaNet's
pseudo-values, which read the whole state (the sum of the levels), and the read weighs each level
by lambda_t^(l) = softplus(L_l dl_t^(l)), dl = level_proj(x) (one logit per value head and level,
as ``LogLinearMamba2``'s ``dl``). The levels >= num_levels are never read by the output, but the
writes read them (through the sum), so its generation state keeps their sum in one more slot:
``S`` [B, num_levels, HV, K, V], the levels 1 .. num_levels - 1 and that sum, which enters the
op as the highest occupied level of the position (all levels >= num_levels decay alike, weigh 0
and move only upwards, so that their sum is all the op needs of them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers.delta import GatedDeltaNet
from linattn.layers.mamba2 import Mamba2
from linattn.layers.mixer import State, StateSpec, check_positive, state_dtype
from linattn.layers.options import delta_options
from linattn.ops.functional import l2norm
from linattn.ops.log_linear import LogLinearState

if TYPE_CHECKING:
    from linattn.models.config import LMConfig

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
            # the levels >= num_levels are never read (nor written from): dropped exactly
            S = _kept_levels(final.S, state["S"].shape[1])
            new_state = {"S": S.to(state["S"].dtype), "offset": final.offset, "conv": conv_state}
        return self.out_proj(y), new_state


def _kept_levels(S: Tensor, levels: int) -> Tensor:
    """The first ``levels`` level states of ``S`` [B, n, ...], zeros appended when n < levels."""
    S = S[:, :levels]
    if S.shape[1] < levels:
        S = torch.cat([S, S.new_zeros(S.shape[0], levels - S.shape[1], *S.shape[2:])], 1)
    return S


class LogLinearGatedDeltaNet(GatedDeltaNet):
    """Log-linear Gated DeltaNet (Guo, Yang et al. 2025, section 3.4); x, y: [B, T, d_model].

    Gated DeltaNet's layer (q, k L2-normalised after the short convolution, beta = sigmoid(b_proj
    x), one decay per value head, the output norm and gate), its memory read through Fenwick
    levels: ``linattn.ops.log_linear_attention(q, k, v, g, lambda, beta=beta)`` with
    lambda_t^(l) = softplus(L_l (level_proj x_t)_l) per value head (the module docstring).

    Args: those of ``GatedDeltaNet``, plus ``num_levels``: the Fenwick levels weighted per token
    and head (15, ``LogLinearMamba2``'s: every level of 16,384 tokens). ``chunk_size`` must be a
    power of two (a chunk's levels are its own).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        num_levels: int = NUM_LEVELS,
        **kwargs,
    ) -> None:
        check_positive("num_levels", num_levels)
        chunk_size = kwargs.get("chunk_size", 64)
        if isinstance(chunk_size, int) and chunk_size >= 1 and chunk_size & (chunk_size - 1):
            raise ValueError(f"chunk_size must be a power of two, got {chunk_size}")
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        self.num_levels = num_levels
        HV = self.num_v_heads
        self.level_proj = nn.Linear(d_model, HV * num_levels, bias=False)
        self.L = nn.Parameter(torch.ones(HV, num_levels))

    @classmethod
    def from_config(cls, config: LMConfig) -> LogLinearGatedDeltaNet:
        """The layer of ``LMConfig.mixers`` name ``"log_linear_gated_deltanet"``: Gated DeltaNet's
        options of the config (``expand_v``, ``num_v_heads``, ``allow_neg_eigval``,
        ``dt_init_range``, ``short_conv``, ``output_gate``, ``chunk_size``, ``conv_size``)."""
        return cls(config.d_model, config.n_heads, expand_v=config.expand_v,
                   num_v_heads=config.num_v_heads, **delta_options(config))  # fmt: skip

    def extra_states(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        return {"offset": (batch_size,)}

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: [B, num_levels, HV, K, V] in float32 (float64 for float64 models), the level
        states 1 .. num_levels - 1 and the sum of the levels above (the module docstring);
        ``offset``: [B] int64, the position of the next token; ``conv``: the short convolution's
        last inputs, as ``GatedDeltaNet``'s."""
        spec = super().state_spec(batch_size, dtype)
        spec["S"] = ((batch_size, self.num_levels, self.num_v_heads, *self.memory_shape()),
                     state_dtype(dtype))  # fmt: skip
        spec["offset"] = ((batch_size,), torch.int64)
        return spec

    def recurrence(self, x, q, k, v, mode, S, keep):
        B, T, _ = x.shape
        q, k = l2norm(q), l2norm(k)
        beta = self.beta(x)  # [B, T, HV]
        g = self.decay(x)  # [B, T, HV]
        dl = self.level_proj(x).view(B, T, self.num_v_heads, self.num_levels)
        lam = F.softplus(self.L.to(dl.dtype) * dl)
        start = None if S is None else self._op_state(S["S"], S["offset"])
        o, final = ops.log_linear_attention(
            q, k, v, g, lam.to(v.dtype), beta=beta, mode=mode, chunk_size=self.chunk_size,
            initial_state=start, output_final_state=keep,
        )  # fmt: skip
        if not keep:
            return o, None
        read = self.num_levels - 1  # the levels the output reads; the rest only through the sum
        above = final.S[:, read:].sum(1, keepdim=True)
        if final.S.shape[1] <= read:
            above = final.S.new_zeros(final.S.shape[0], 1, *final.S.shape[2:])
        return o, {"S": torch.cat([_kept_levels(final.S, read), above], 1),
                   "offset": final.offset}  # fmt: skip

    def _op_state(self, S: Tensor, offset: Tensor) -> LogLinearState:
        """The op's level states from the layer's: the read levels in their slots, the sum of the
        levels above in the slot of the position's highest set bit (an occupied level >= L,
        whenever that sum can be nonzero)."""
        read = self.num_levels - 1
        top = [int(p).bit_length() - 1 for p in offset.tolist()]  # -1: no level occupied
        S0 = S.new_zeros(S.shape[0], max(read, *(t + 1 for t in top), 1), *S.shape[2:])
        S0[:, :read] = S[:, :read]
        for row, t in enumerate(top):
            if t >= read:
                S0[row, t] = S[row, read]
        return LogLinearState(S0, offset)
