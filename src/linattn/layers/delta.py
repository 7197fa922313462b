"""The delta-rule mixers: DeltaNet, Gated DeltaNet, Kimi Delta Attention (spec sections 7, 8, 10).

    S <- Diag(alpha_t) S                        (the decay, when there is one)
    S <- S + beta_t k_t (v_t - S^T k_t)^T       (the delta rule: write only the difference)
    o_t = S^T q_t / sqrt(K)

    DeltaNet       A_t = I - beta_t k_t k_t^T                 (Schlag 2021; Yang 2024b)
    GatedDeltaNet  A_t = alpha_t (I - beta_t k_t k_t^T)       (Yang, Kautz and Hatamizadeh, 2025)
    KDA            A_t = (I - beta_t k_t k_t^T) Diag(alpha_t) (Kimi Team, 2025)

and the write is ``w_t = beta_t v_t`` for all three. What the papers build around it: q and k
L2-normalised per head (so ``I - beta k k^T`` has eigenvalues 1 and 1 - beta, spec 7.2), ``beta_t =
sigmoid(b_proj x_t)`` in (0, 1), or in (0, 2) with ``allow_neg_eigval`` (the eigenvalue 1 - beta
then reaches -1; Grazzi et al., 2025).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, fla_short_conv, load, require
from linattn.layers.base import RecurrentMixer
from linattn.layers.common import DecayGate
from linattn.ops._checks import flag


class DeltaNet(RecurrentMixer):
    """The delta rule, no decay, as fla's ``DeltaNet`` layer defines it (Yang et al., 2024b):
    short convolution + SiLU on q, k, v (on), q and k L2-normalised, ``beta = sigmoid(b_proj x)``,
    per-head RMSNorm of the output (eps 1e-5) and no output gate (fla's ``use_gate=False``).

    Args: those of ``RecurrentMixer``, plus ``allow_neg_eigval``. (Only DeltaNet itself takes
    fla's defaults ``output_gate=False``, ``norm_eps=1e-5``; its gated subclasses keep
    ``RecurrentMixer``'s.)
    """

    decay_kind: str | None = None

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        key_dim: int | None = None,
        *,
        allow_neg_eigval: bool = False,
        decay_rank: int | None = None,
        **kwargs,
    ) -> None:
        if type(self) is DeltaNet:  # fla's DeltaNet defaults (the subclasses keep their own)
            kwargs.setdefault("output_gate", False)
            kwargs.setdefault("norm_eps", 1e-5)
        super().__init__(d_model, n_heads, head_dim, key_dim, **kwargs)
        self.allow_neg_eigval = flag("allow_neg_eigval", allow_neg_eigval)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        self.decay = None
        if self.decay_kind is not None:
            rank = self.head_dim if decay_rank is None else decay_rank
            self.decay = DecayGate(d_model, n_heads, self.key_dim, self.decay_kind, rank=rank)

    def beta(self, x: Tensor) -> Tensor:
        """The write strength: x [B, T, d_model] -> sigmoid(b_proj x) [B, T, H], times 2 with
        ``allow_neg_eigval``."""
        beta = torch.sigmoid(self.b_proj(x))
        return 2.0 * beta if self.allow_neg_eigval else beta

    def recurrence(self, x, q, k, v, mode, S, keep):
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = self.beta(x)  # [B, T, H]
        g = None if self.decay is None else self.decay(x)  # [B, T, H] or [B, T, H, K]
        return ops.delta_rule(
            q,
            k,
            v,
            beta,
            g,
            mode=mode,
            chunk_size=self.chunk_size,
            initial_state=S,
            output_final_state=keep,
        )

    @classmethod
    def from_fla(cls, module: nn.Module) -> DeltaNet:
        """Our DeltaNet with the options and weights of fla's ``DeltaNet`` layer (SiLU and L2
        norm on q and k, beta from ``b_proj``; refused otherwise)."""
        if cls is not DeltaNet:
            raise TypeError(f"{cls.__name__}.from_fla is not defined; use DeltaNet.from_fla")
        check_type(module, "DeltaNet", "fla")
        require(module, qk_activation="silu", qk_norm="l2", use_beta=True)
        H = module.num_heads
        layer = cls(
            module.hidden_size,
            H,
            module.head_v_dim,
            module.head_k_dim,
            allow_neg_eigval=module.allow_neg_eigval,
            short_conv=module.use_short_conv,
            conv_size=module.conv_size,
            output_gate=module.use_gate,
            norm_eps=module.o_norm.eps,
        )
        weights = {
            "q_proj.weight": module.q_proj.weight,
            "k_proj.weight": module.k_proj.weight,
            "v_proj.weight": module.v_proj.weight,
            "b_proj.weight": module.b_proj.weight,
            "o_norm.weight": module.o_norm.weight,
            "o_proj.weight": module.o_proj.weight,
        }
        if module.use_gate:
            weights["g_proj.weight"] = module.g_proj.weight
        conv = fla_short_conv(module)
        if conv is not None:
            weights["conv.weight"] = conv
        return load(layer, weights, module.q_proj.weight)


class GatedDeltaNet(DeltaNet):
    """The delta rule with one decay per head: ``g = -exp(A_log) softplus(a_proj x + dt_bias)``,
    initialised as Mamba-2 (``DecayGate``, kind ``"scalar"``); SiLU output gate."""

    decay_kind = "scalar"


class KimiDeltaAttention(DeltaNet):
    """The delta rule with one decay per key channel (KDA): ``g = -exp(A_log) softplus(f x +
    dt_bias)`` with ``f`` low-rank (d_model -> head_dim -> H*K, as Kimi Linear), ``A_log`` per head,
    ``dt_bias`` per channel; sigmoid output gate through a low-rank projection (d_model -> head_dim
    -> H*V, with bias)."""

    decay_kind = "channel"

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, **kwargs) -> None:
        head_dim = d_model // n_heads if head_dim is None and n_heads > 0 else head_dim
        kwargs.setdefault("gate_activation", "sigmoid")
        kwargs.setdefault("gate_rank", head_dim)
        super().__init__(d_model, n_heads, head_dim, **kwargs)
