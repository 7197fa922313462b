"""Preconditioned DeltaNet's layers (arXiv:2604.21100), as fla 0.6.0's
``fla.layers.PrecondGatedDeltaNet`` and ``fla.layers.PrecondKDA`` define them. Preconditioned
Gated DeltaNet's is: Gated DeltaNet's layer with the ATK
preconditioner's own gate and strength per query/key head,

    g_atk = -exp(A_log_atk) softplus(a_atk_proj x + dt_bias_atk),   beta_atk = sigmoid(b_atk_proj x)

and the op ``linattn.ops.precond_delta_rule`` (q, k L2-normalised by the op). The layer keeps two
states: the memory S [B, HV, K, V] and the preconditioner A [B, H, K] (``extra_states``);
``PrecondKDA`` is KDA's layer with the same preconditioner, per value head.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from linattn.layers.delta import GatedDeltaNet, KimiDeltaAttention
from linattn.layers.modules import DecayGate
from linattn.ops.precond_delta_rule import CENTER, EPS, X, precond_delta_rule


def _check_squash(squash_x: object, squash_eps: object, log_atk_scale_init: object) -> None:
    for name, value in (("squash_x", squash_x), ("squash_eps", squash_eps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if not isinstance(log_atk_scale_init, (int, float)) or not math.isfinite(log_atk_scale_init):
        raise ValueError(f"log_atk_scale_init must be finite, got {log_atk_scale_init!r}")


class PrecondGatedDeltaNet(GatedDeltaNet):
    """Preconditioned Gated DeltaNet as fla 0.6.0's ``PrecondGatedDeltaNet`` layer.

    Args: those of ``GatedDeltaNet`` (``expand_v``, ``num_v_heads``, ``short_conv``,
    ``output_gate``, ``allow_neg_eigval``, ``norm_eps``, ...), plus fla's ``squash_x`` (the
    squash range x, 1.5), ``squash_eps`` (1e-6) and ``log_atk_scale_init`` (the per-head centre's
    initial value, -0.2; a learnable parameter ``log_atk_scale`` [H]).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        squash_x: float = X,
        squash_eps: float = EPS,
        log_atk_scale_init: float = CENTER,
        **kwargs,
    ) -> None:
        _check_squash(squash_x, squash_eps, log_atk_scale_init)
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        H = n_heads
        self.squash_x, self.squash_eps = float(squash_x), float(squash_eps)
        self.atk_decay = DecayGate(d_model, H, self.key_dim, "scalar", A_range=(0.0, 16.0))
        self.b_atk_proj = nn.Linear(d_model, H, bias=False)
        self.log_atk_scale = nn.Parameter(torch.full((H,), float(log_atk_scale_init)))

    def extra_states(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        return {"A": (batch_size, self.n_heads, self.key_dim)}

    def recurrence(self, x: Tensor, q, k, v, mode, S, keep):
        S0, A0 = (None, None) if S is None else (S["S"], S["A"])
        o, S, A = precond_delta_rule(
            q, k, v, self.atk_decay(x), torch.sigmoid(self.b_atk_proj(x)), self.beta(x),
            self.decay(x), x=self.squash_x, eps=self.squash_eps, log_atk_scale=self.log_atk_scale,
            mode=mode, chunk_size=self.chunk_size, initial_state=S0, initial_A_state=A0,
            output_final_state=keep,
        )  # fmt: skip
        return o, ({"S": S, "A": A} if keep else None)

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> GatedDeltaNet:
        raise TypeError(f"{cls.__name__} has no transformers counterpart; use from_fla")

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> PrecondGatedDeltaNet:
        """Our layer with the options and weights of fla's ``fla.layers.PrecondGatedDeltaNet``."""
        from linattn.layers.convert import precond_gated_deltanet_from_fla

        return precond_gated_deltanet_from_fla(cls, module, **kwargs)


class PrecondKDA(KimiDeltaAttention):
    """Preconditioned KDA as fla 0.6.0's ``fla.layers.PrecondKDA`` layer: KDA's layer (a decay
    per key channel, low-rank gates) with the ATK preconditioner, whose gate, strength and
    centre are per value head (fla's layer repeats q, k and beta to the value heads, so each value
    head keeps its own preconditioner A [B, HV, K]):

        g_atk = -exp(A_log_atk) softplus(a_proj x + dt_bias_atk),  beta_atk = sigmoid(b_atk_proj x)

    (our ``atk_decay`` holds fla's ``a_proj``, ``A_log_atk``, ``dt_bias_atk``); beta =
    sigmoid(b_proj x) per query/key head, as fla's. Args: those of ``KimiDeltaAttention`` plus
    ``squash_x``, ``squash_eps``, ``log_atk_scale_init`` (as ``PrecondGatedDeltaNet``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        squash_x: float = X,
        squash_eps: float = EPS,
        log_atk_scale_init: float = CENTER,
        **kwargs,
    ) -> None:
        _check_squash(squash_x, squash_eps, log_atk_scale_init)
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        HV = self.num_v_heads
        self.squash_x, self.squash_eps = float(squash_x), float(squash_eps)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)  # beta per q/k head (fla's)
        self.atk_decay = DecayGate(d_model, HV, self.key_dim, "scalar", A_range=(1.0, 16.0))
        self.b_atk_proj = nn.Linear(d_model, HV, bias=False)
        self.log_atk_scale = nn.Parameter(torch.full((HV,), float(log_atk_scale_init)))

    def extra_states(self, batch_size: int) -> dict[str, tuple[int, ...]]:
        return {"A": (batch_size, self.num_v_heads, self.key_dim)}

    def recurrence(self, x: Tensor, q, k, v, mode, S, keep):
        G = self.num_v_heads // self.n_heads
        q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
        beta = self.beta(x).repeat_interleave(G, dim=2)
        S0, A0 = (None, None) if S is None else (S["S"], S["A"])
        o, S, A = precond_delta_rule(
            q, k, v, self.atk_decay(x), torch.sigmoid(self.b_atk_proj(x)), beta, self.decay(x),
            x=self.squash_x, eps=self.squash_eps, log_atk_scale=self.log_atk_scale, mode=mode,
            chunk_size=self.chunk_size, initial_state=S0, initial_A_state=A0,
            output_final_state=keep,
        )  # fmt: skip
        return o, ({"S": S, "A": A} if keep else None)

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> KimiDeltaAttention:
        raise TypeError(f"{cls.__name__} has no transformers counterpart; use from_fla")

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> PrecondKDA:
        """Our layer with the options and weights of fla's ``fla.layers.PrecondKDA``."""
        from linattn.layers.convert import precond_kda_from_fla

        return precond_kda_from_fla(cls, module, **kwargs)
