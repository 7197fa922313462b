"""``IPLR`` and ``DPLR``: layers for the generalized delta rule's two general transitions (spec
section 8 generalised, section 10; Yang et al. 2024b, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", section 3.3 on identity plus low rank; Peng et al. 2025,
"RWKV-7 "Goose" with Expressive Dynamic State Evolution", section 3, on diagonal plus low rank
with a vector-valued learning rate). Neither paper nor fla 0.6.0 defines a layer for them (fla has
the ops ``chunk_iplr_delta_rule``, ``chunk_dplr_delta_rule``); these take DeltaNet's layer
(projections, short convolution + SiLU, L2-normalised q and k, per-head RMSNorm with a SiLU output
gate) and give the delta rule a learning rate lambda_t per key channel:

    IPLR   S_t = (I - (k_t * lambda_t) k_t^T) S_{t-1} + (k_t * lambda_t) v_t^T
             = S_{t-1} + (k_t * lambda_t) (v_t - S_{t-1}^T k_t)^T
    DPLR   S_t = (Diag(alpha_t) - (k_t * lambda_t) k_t^T) S_{t-1} + (k_t * lambda_t) v_t^T
    lambda_t = sigmoid(W_l x_t + b_l)  (2 sigmoid with ``allow_neg_eigval``)
    alpha_t: KDA's decay per key channel (``DecayGate`` "channel")

i.e. ``linattn.ops.generalized_delta_rule`` with a = -(k * lambda), b = k and the written key
k * lambda (registry entries "iplr" and "dplr"). With lambda_t = beta_t in every channel IPLR is
DeltaNet's rule; with unit keys its transition's eigenvalues are 1 and 1 - sum_c lambda_c k_c^2,
in (0, 1] (in (-1, 1] with ``allow_neg_eigval``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from linattn import ops
from linattn.layers.modules import DecayGate
from linattn.layers.recurrent import RecurrentMixer
from linattn.ops.checks import flag
from linattn.ops.functional import l2norm
from linattn.ops.rules import dplr

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class IPLR(RecurrentMixer):
    """The IPLR layer (the module docstring). Args: those of ``RecurrentMixer`` (``d_model``,
    ``n_heads``, ``head_dim``, ``key_dim``, ``short_conv``, ``conv_size``, ``output_gate``,
    ``norm_eps``; ``chunk_size`` default 32, the generalized rule's) and ``allow_neg_eigval``
    (False: lambda in (0, 1)). Grouped value heads are not offered (the written key is per
    value head)."""

    decay_kind: str | None = None  # DPLR: "channel"

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        allow_neg_eigval: bool = False,
        dt_init_range: tuple[float, float] = (1e-3, 1e-1),
        chunk_size: int = dplr.CHUNK_SIZE,
        **kwargs,
    ) -> None:
        if kwargs.get("num_v_heads") not in (None, n_heads):
            raise ValueError(f"{type(self).__name__} takes no grouped value heads (num_v_heads)")
        super().__init__(d_model, n_heads, chunk_size=chunk_size, **kwargs)
        self.allow_neg_eigval = flag("allow_neg_eigval", allow_neg_eigval)
        H, K = self.n_heads, self.key_dim
        self.rate_proj = nn.Linear(d_model, H * K, bias=True)
        self.decay = None
        if self.decay_kind is not None:
            self.decay = DecayGate(d_model, H, K, self.decay_kind, rank=self.head_dim,
                                   dt_range=dt_init_range)  # fmt: skip

    @classmethod
    def from_config(cls, config: LMConfig) -> IPLR:
        """The mixer of ``LMConfig.mixers`` (``"iplr"``, ``"dplr"``): ``delta_options`` of the
        config (its head size, convolution, output gate, norm, chunk size, allow_neg_eigval,
        the decays' initial step sizes)."""
        from linattn.layers.options import delta_options

        return cls(config.d_model, config.n_heads, **delta_options(config))

    def recurrence(self, x, q, k, v, mode, S, keep):
        B, T, H, K = k.shape
        q, k = l2norm(q), l2norm(k)
        rate = torch.sigmoid(self.rate_proj(x)).view(B, T, H, K)
        if self.allow_neg_eigval:
            rate = 2 * rate
        written = k * rate.to(k.dtype)
        g = None if self.decay is None else self.decay(x)
        return ops.generalized_delta_rule(
            q, written, v, -written, k, g, mode=mode, chunk_size=self.chunk_size,
            initial_state=S, output_final_state=keep,
        )  # fmt: skip


class DPLR(IPLR):
    """The DPLR layer (the module docstring): IPLR's with KDA's decay per key channel (its
    initial step sizes ``dt_init_range``)."""

    decay_kind = "channel"
