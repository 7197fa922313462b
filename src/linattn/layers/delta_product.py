"""Gated DeltaProduct (Siems et al., 2025): n_h delta-rule writes per token.

    S <- alpha_t S
    S <- S + beta_tj k_tj (v_tj - S^T k_tj)^T      for j = 1 .. n_h
    o_t = S^T q_t / sqrt(K)

The token's transition is alpha_t prod_j (I - beta_tj k_tj k_tj^T): a product of n_h generalized
Householder matrices (DeltaProduct, beside the mechanism table of docs/design.md), rank n_h
instead of Gated DeltaNet's one.
The layer is Gated DeltaNet's with n_h keys, values and write strengths per token, as fla 0.6.0's
``fla.layers.GatedDeltaProduct`` builds it: ``k_proj`` and ``v_proj`` n_h times wider, laid out
[write, head, channel]; ``beta = sigmoid(b_proj x)`` per write and value head (times 2 with
``allow_neg_eigval``, fla's default: eigenvalues down to -1); the forget gate alpha_t =
exp(-exp(A_log) softplus(a_proj x + dt_bias)) once per token (``use_forget_gate``); short
convolutions + SiLU; q, k L2-normalised; ``o_proj(rmsnorm(o) * silu(g_proj x))``.
"""

from __future__ import annotations

from torch import nn

from linattn import ops
from linattn.layers.delta import GatedDeltaNet
from linattn.ops.checks import flag
from linattn.ops.delta_product import householder_count
from linattn.ops.functional import l2norm


class GatedDeltaProduct(GatedDeltaNet):
    """Gated DeltaProduct as fla 0.6.0's layer defines it (the module docstring).

    Args (fla's names): those of ``GatedDeltaNet`` (``d_model``, ``n_heads``, ``head_dim`` K,
    ``expand_v`` (V = K expand_v, default 2), ``num_v_heads``, ``short_conv``, ``conv_size``,
    ``output_gate`` (fla's ``use_output_gate``), ``norm_eps`` (1e-5), ``chunk_size``), and
        num_householder: n_h >= 1 writes per token (default 2); 1 is Gated DeltaNet.
        use_forget_gate: the decay alpha_t (default True); False: no decay, a DeltaProduct.
        allow_neg_eigval: beta in (0, 2) (default True, as fla's layer), else (0, 1).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int | None = None,
        *,
        num_householder: int = 2,
        use_forget_gate: bool = True,
        allow_neg_eigval: bool = True,
        **kwargs,
    ) -> None:
        n = householder_count(num_householder)
        super().__init__(
            d_model, n_heads, head_dim, allow_neg_eigval=allow_neg_eigval, writes=n, **kwargs
        )
        self.num_householder = n
        self.use_forget_gate = flag("use_forget_gate", use_forget_gate)
        if not self.use_forget_gate:
            self.decay = None

    def recurrence(self, x, q, k, v, mode, S, keep):
        # q [B, T, H, K]; k [B, T n, H, K], v [B, T n, HV, V]: fla's interleaved writes
        B, T = x.shape[:2]
        n, HV = self.num_householder, self.num_v_heads
        q, k = l2norm(q), l2norm(k)
        beta = self.beta(x).reshape(B, T * n, HV)  # [B, T, n*HV] -> [B, T n, HV]
        g = None if self.decay is None else self.decay(x)  # [B, T, HV]: once per token
        return ops.gated_delta_product(
            q, k, v, beta, g, num_householder=n, mode=mode, chunk_size=self.chunk_size,
            initial_state=S, output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_fla(cls, module: nn.Module, **kwargs) -> GatedDeltaProduct:
        """Our layer with the options and weights of fla's ``fla.layers.GatedDeltaProduct``
        (its three short convolutions as our one over [q | k | v])."""
        from linattn.layers.convert import gated_delta_product_from_fla

        return gated_delta_product_from_fla(cls, module, **kwargs)
