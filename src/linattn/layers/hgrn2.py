"""``HGRN2``: HGRN2's token mixer (Qin et al. 2024, "HGRN2: Gated Linear RNNs with State
Expansion", section 3), as fla 0.6.0's ``HGRN2Attention`` defines it:

    q = silu(W_q x),  f = W_f x,  i = W_i x                    (no short convolution)
    g_t = logsigmoid(f_t),  k_t = 1 - exp(g_t)                  (the forget gate and its complement)
    S_t = Diag(exp g_t) S_{t-1} + k_t i_t^T,  o_t = S_t^T q_t / sqrt(K)   (GLA, spec section 10)
    y = W_o rmsnorm(o)                                          (one norm over all heads' outputs)

with K = ``expand_ratio`` key channels and d_model / H value channels per head. It is GLA
reparametrised (registry entry "hgrn2"), computed by ``linattn.ops.linear_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, load, require
from linattn.layers.recurrent import RecurrentMixer


class WidthRMSNorm(nn.Module):
    """RMSNorm over all heads' outputs together ([B, T, H, V] normed over H V), times
    act(gate) when a gate [B, T, H, V] is given (``activation`` "silu", default, or "sigmoid"):
    fla's HGRN2 ``g_norm``, LightNet's gated one, lightning attention's (sigmoid); the ``o_norm``
    slot of ``RecurrentMixer``."""

    def __init__(self, width: int, eps: float, activation: str = "silu") -> None:
        super().__init__()
        if activation not in ("silu", "sigmoid"):
            raise ValueError(f"activation must be 'silu' or 'sigmoid', got {activation!r}")
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.activation = activation

    def forward(self, o: Tensor, gate: Tensor | None) -> Tensor:
        flat = o.flatten(-2)
        out = F.rms_norm(flat, (flat.shape[-1],), self.weight, self.eps).view_as(o)
        if gate is None:
            return out
        return out * (F.silu(gate) if self.activation == "silu" else torch.sigmoid(gate))


class HGRN2(RecurrentMixer):
    """HGRN2 (the module docstring).

    Args (besides ``chunk_size`` and ``mode`` of ``RecurrentMixer``): ``d_model``; ``n_heads``;
    ``expand_ratio``: the key (forget-gate) channels per head (fla's ``expand_ratio``; default
    d_model // n_heads); ``norm_eps``: the output RMSNorm's epsilon. fla's short convolutions
    (without activation) are not computed: q, f and i enter as projected.
    """

    silu_without_conv = False  # q's SiLU is HGRN2's own; f and i enter as projected

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        expand_ratio: int | None = None,
        norm_eps: float = 1e-5,
        **kwargs,
    ) -> None:
        for name in ("short_conv", "output_gate", "head_dim", "key_dim", "num_v_heads"):
            if name in kwargs:
                raise TypeError(f"HGRN2 does not take {name} (fla's HGRN2Attention has none)")
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        key_dim = d_model // n_heads if expand_ratio is None else expand_ratio
        super().__init__(
            d_model, n_heads, d_model // n_heads, key_dim, short_conv=False, output_gate=False,
            norm_eps=norm_eps, **kwargs,
        )  # fmt: skip
        self.o_norm = WidthRMSNorm(d_model, norm_eps)

    def recurrence(self, x, q, k, v, mode, S, keep):
        g = F.logsigmoid(k)  # k holds the forget-gate logits f
        return ops.linear_attention(
            F.silu(q), 1 - g.exp(), v, g, mode=mode, chunk_size=self.chunk_size,
            initial_state=S, output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_fla(cls, module: nn.Module) -> HGRN2:
        """Our HGRN2 with the options and weights of fla's ``HGRN2Attention`` layer."""
        check_type(module, "HGRN2Attention", "fla")
        require(module, use_short_conv=False)
        if module.g_norm.weight is None:
            raise ValueError("HGRN2Attention with elementwise_affine=False is not supported")
        layer = cls(
            module.hidden_size, module.num_heads, expand_ratio=module.expand_ratio,
            norm_eps=module.g_norm.eps,
        )  # fmt: skip
        weights = {
            "q_proj.weight": module.q_proj.weight,
            "k_proj.weight": module.f_proj.weight,
            "v_proj.weight": module.i_proj.weight,
            "o_proj.weight": module.o_proj.weight,
            "o_norm.weight": module.g_norm.weight,
        }
        return load(layer, weights, module.q_proj.weight)
