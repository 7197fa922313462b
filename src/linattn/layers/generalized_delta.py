"""The generalized delta rule's delta-rule layers: Comba and Gated DeltaNet-2 (spec section 8
generalised; ``linattn.ops.comba``, ``linattn.ops.gated_deltanet2``), as fla 0.6.0 defines them.

    Comba   S_t = alpha_t S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T p_t))^T          (Hu et al., 2025)
    GDN-2   S_t = (I - k_t (b_t * k_t)^T) Diag(alpha_t) S_{t-1} + k_t (w_t * v_t)^T

Comba reads the correction with its own key ``p = k sigmoid(d)`` (d per head) and corrects the
query, ``q <- q - D p`` (D per head); GDN-2 splits KDA's beta into an erase gate b per key
channel and a write gate w per value channel. Both keep Gated DeltaNet's / KDA's layer around
the op (``DeltaNet``: projections, short convolution, L2-normalised q, k (and p), the decay
gate, per-head RMSNorm with an output gate).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from linattn import ops
from linattn.layers.delta import GatedDeltaNet, KimiDeltaAttention
from linattn.layers.modules import DecayGate
from linattn.ops.checks import flag
from linattn.ops.functional import l2norm, write_strength
from linattn.ops.rules import dplr


class Comba(GatedDeltaNet):
    """Comba (Hu et al., 2025, "Improving Bilinear RNNs with Closed-loop Control") as fla 0.6.0's
    ``fla.layers.Comba``: Gated DeltaNet's layer (scalar decay per value head, beta =
    sigmoid(b_proj x)) with

        p = k * sigmoid(d)        (``inner_decay``: d per q/k head, initialised to 1)
        q <- q - D p              (``output_correction``: D per q/k head, ``correction_factor``)
        q, k, p L2-normalised,    o = comba(q, k, v, p, beta, g)

    and a sigmoid output gate (fla's ``FusedRMSNormGated(activation='sigmoid')``).

    Args: those of ``GatedDeltaNet`` (``expand_v`` default 2, ``num_v_heads``, ``short_conv``,
    ``output_gate``, ``norm_eps`` 1e-5, ...), plus ``inner_decay``, ``output_correction`` and
    ``correction_factor`` (fla's names, defaults True, True, 1.0).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        inner_decay: bool = True,
        output_correction: bool = True,
        correction_factor: float = 1.0,
        **kwargs,
    ) -> None:
        if isinstance(correction_factor, bool) or not isinstance(correction_factor, (int, float)):
            raise ValueError(f"correction_factor must be a number, got {correction_factor!r}")
        if not math.isfinite(correction_factor):
            raise ValueError(f"correction_factor must be finite, got {correction_factor!r}")
        kwargs.setdefault("gate_activation", "sigmoid")
        kwargs.setdefault("chunk_size", dplr.CHUNK_SIZE)  # the generalized rule's fastest
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        H = n_heads
        inner_decay = flag("inner_decay", inner_decay)
        output_correction = flag("output_correction", output_correction)
        self.inner_decay = nn.Parameter(torch.ones(H)) if inner_decay else None
        correction = torch.full((H,), float(correction_factor))
        self.D = nn.Parameter(correction) if output_correction else None

    def recurrence(self, x, q, k, v, mode, S, keep):
        # q, k [B, T, H, K]; the per-head parameters broadcast as [H, 1]
        p = k if self.inner_decay is None else k * torch.sigmoid(self.inner_decay)[:, None]
        if self.D is not None:
            q = q - self.D[:, None] * p
        q, k, p = l2norm(q), l2norm(k), l2norm(p)
        return ops.comba(
            q, k, v, p, self.beta(x), self.decay(x),
            mode=mode, chunk_size=self.chunk_size, initial_state=S, output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> GatedDeltaNet:
        raise TypeError(f"{cls.__name__} has no transformers counterpart; use from_fla")

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> Comba:
        """Our layer with the weights of fla's ``fla.layers.Comba`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import comba_from_fla

        return comba_from_fla(cls, module, **kwargs)


class GatedDeltaNet2(KimiDeltaAttention):
    """Gated DeltaNet-2 as fla 0.6.0's ``fla.layers.GatedDeltaNet2``: KDA's layer (per-channel
    decay from a low-rank ``f_proj``, sigmoid output gate with a low-rank projection) with its
    beta split in two gates:

        b = sigmoid(b_proj x)   [B, T, H, K]   the erase gate (times 2 with ``allow_neg_eigval``)
        w = sigmoid(w_proj x)   [B, T, HV, V]  the write gate

    The decay (``A_log`` per q/k head, ``dt_bias`` per key channel) and b are per q/k head and
    shared by its G = HV / H value heads (fla repeats them).

    Args: those of ``KimiDeltaAttention`` (``expand_v`` default 1, ``num_v_heads``, ...);
    ``gate_bias`` defaults to True (fla's ``g_proj`` has a bias).
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, **kwargs) -> None:
        kwargs.setdefault("gate_bias", True)
        kwargs.setdefault("chunk_size", dplr.CHUNK_SIZE)  # the generalized rule's fastest
        super().__init__(d_model, n_heads, head_dim, **kwargs)
        H, HV, K, V = self.n_heads, self.num_v_heads, self.key_dim, self.head_dim
        self.b_proj = nn.Linear(d_model, H * K, bias=False)
        self.w_proj = nn.Linear(d_model, HV * V, bias=False)
        self.decay = DecayGate(d_model, H, K, "channel", rank=V, A_range=self.A_init_range)

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, d_model] -> g, b [B, T, HV, K] (repeated over each head's value heads), w
        [B, T, HV, V]."""
        B, T, _ = x.shape
        H, HV, K, V = self.n_heads, self.num_v_heads, self.key_dim, self.head_dim
        b = write_strength(self.b_proj(x), self.allow_neg_eigval).view(B, T, H, K)
        g, b = (t.repeat_interleave(HV // H, dim=2) for t in (self.decay(x), b))
        w = torch.sigmoid(self.w_proj(x)).view(B, T, HV, V)  # [B, T, HV*V] -> [B, T, HV, V]
        return g, b, w

    def recurrence(self, x, q, k, v, mode, S, keep):
        q, k = l2norm(q), l2norm(k)
        g, b, w = self.gates(x)
        return ops.gated_deltanet2(
            q, k, v, g, b, w,
            mode=mode, chunk_size=self.chunk_size, initial_state=S, output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_transformers(cls, module: nn.Module, **kwargs) -> KimiDeltaAttention:
        raise TypeError(f"{cls.__name__} has no transformers counterpart; use from_fla")

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> GatedDeltaNet2:
        """Our layer with the weights of fla's ``fla.layers.GatedDeltaNet2`` (see
        ``linattn.layers.convert``)."""
        from linattn.layers.convert import gdn2_from_fla

        return gdn2_from_fla(cls, module, **kwargs)
