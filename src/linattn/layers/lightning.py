"""``LightningAttention``: the token mixer of lightning attention (Qin et al. 2024, "Lightning
Attention-2: A Free Lunch for Handling Unlimited Sequence Lengths in Large Language Models"; the
layer as MiniMax-01 builds it, MiniMax 2025, "MiniMax-01: Scaling Foundation Models with Lightning
Attention", section 2.2):

    q, k, v = silu(W_q x), silu(W_k x), silu(W_v x)            (no short convolution)
    S_t = gamma_h S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t / sqrt(K)
    gamma_h = exp(-(8 / H) (1 - l / L) h),  h = 0 .. H - 1     (layer l of L; fla's slopes)
    y = W_o (rmsnorm(o) * weight * sigmoid(W_g x))             (one norm over all heads)

The memory is the scalar-decay one with a constant decay per head (registry entry "lightning",
spec section 10), computed by ``linattn.ops.linear_attention``: the decays are those of fla
0.6.0's ``chunk_lightning_attn`` (``linattn.compat.simple_gla.lightning_gamma``), and its scale
1 / sqrt(K). fla has no lightning-attention layer, so there is no ``from_fla``.

``slopes="minimax"`` takes MiniMax-01's decays instead, ALiBi's slopes scaled by the depth,

    gamma_h = exp(-2^(-8 (h + 1) / H) (1 - l / (L - 1 + 1e-5) + 1e-5))

and ``scale=1.0`` its unscaled read: ``from_transformers`` builds the layer so, with the weights
of transformers' ``MiniMaxLightningAttention``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.layers._reference import check_type, load
from linattn.layers.hgrn2 import WidthRMSNorm
from linattn.layers.recurrent import RecurrentMixer

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


SLOPES = ("fla", "minimax")


def lightning_log_decays(
    H: int, layer_idx: int, num_layers: int, dtype: torch.dtype, device=None, slopes: str = "fla"
) -> Tensor:
    """Lightning attention's log-decays, h = 0 .. H - 1, computed in float64: fla's
    -(8 / H) (1 - l / L) h (``lightning_gamma``), or MiniMax-01's
    -2^(-8 (h + 1) / H) (1 - l / (L - 1 + 1e-5) + 1e-5) (``slopes="minimax"``)."""
    h = torch.arange(H, dtype=torch.float64, device=device)
    if slopes == "minimax":
        depth = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
        return (-(2.0 ** (-8.0 * (h + 1) / H)) * depth).to(dtype)
    return (-(8.0 / H) * (1.0 - layer_idx / num_layers) * h).to(dtype)


class LightningAttention(RecurrentMixer):
    """Lightning attention (the module docstring).

    Args (besides ``chunk_size`` and ``mode`` of ``RecurrentMixer``): ``d_model``, ``n_heads``;
    ``head_dim``: the key and value width per head (default d_model // n_heads); ``layer_idx``,
    ``num_layers``: the layer's place l of L, which sets the decays (default 0 of 1: the
    strongest decays, exp(-8 h / H)); ``output_gate``: the sigmoid gate (default True; without
    it, the norm alone); ``norm_eps``: 1e-6; ``slopes``: "fla" (default) or "minimax", the
    decays; ``scale``: multiplies q (None: 1 / sqrt(head_dim), fla's; MiniMax-01's 1.0).
    """

    silu_without_conv = True  # q, k and v all through SiLU, as MiniMax-01's layer

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        head_dim: int | None = None,
        layer_idx: int = 0,
        num_layers: int = 1,
        output_gate: bool = True,
        norm_eps: float = 1e-6,
        slopes: str = "fla",
        scale: float | None = None,
        **kwargs,
    ) -> None:
        if slopes not in SLOPES:
            raise ValueError(f"slopes must be one of {SLOPES}, got {slopes!r}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not scale > 0):  # fmt: skip
            raise ValueError(f"scale must be a positive number or None, got {scale!r}")
        for name in ("short_conv", "key_dim", "num_v_heads", "gate_activation", "gate_rank"):
            if name in kwargs:
                raise TypeError(f"LightningAttention does not take {name}")
        for name, value in (("layer_idx", layer_idx), ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if num_layers < 1 or not 0 <= layer_idx < num_layers:
            raise ValueError(
                f"layer_idx must lie in [0, num_layers) with num_layers >= 1, got layer_idx "
                f"{layer_idx} and num_layers {num_layers}"
            )
        super().__init__(
            d_model, n_heads, head_dim, short_conv=False, output_gate=output_gate,
            gate_activation="sigmoid", norm_eps=norm_eps, **kwargs,
        )  # fmt: skip
        self.layer_idx, self.num_layers = layer_idx, num_layers
        self.slopes, self.scale = slopes, scale
        self.o_norm = WidthRMSNorm(n_heads * self.head_dim, norm_eps, activation="sigmoid")

    @classmethod
    def from_config(cls, config: LMConfig) -> LightningAttention:
        """The mixer ``"lightning"`` of ``LMConfig.mixers``: the config's ``head_dim``,
        ``output_gate`` (None: on), ``norm_eps`` and ``chunk_size``; the decays of layer 0 of 1
        (the config does not tell a block its index)."""
        kwargs = dict(head_dim=config.head_size, norm_eps=config.norm_eps)
        if config.output_gate is not None:
            kwargs["output_gate"] = config.output_gate
        if config.chunk_size is not None:
            kwargs["chunk_size"] = config.chunk_size
        return cls(config.d_model, config.n_heads, **kwargs)

    def recurrence(self, x, q, k, v, mode, S, keep):
        B, T, H = q.shape[:3]
        g = lightning_log_decays(H, self.layer_idx, self.num_layers, q.dtype, q.device,
                                 self.slopes)  # fmt: skip
        return ops.linear_attention(
            q, k, v, g.expand(B, T, H), scale=self.scale, mode=mode, chunk_size=self.chunk_size,
            initial_state=S, output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_transformers(cls, module: nn.Module) -> LightningAttention:
        """Our layer with the options and weights of transformers' ``MiniMaxLightningAttention``
        (MiniMax-01's decays, no scale, its fused q/k/v projection split per head)."""
        check_type(module, "MiniMaxLightningAttention", "transformers")
        H, D = module.num_attention_heads, module.head_dim
        d_model = module.qkv_proj.in_features
        x = torch.linspace(-3, 3, 7, dtype=torch.float64)
        if not torch.allclose(module.act_fn(x), F.silu(x)):
            raise ValueError("only MiniMaxLightningAttention with hidden_act 'silu'")
        layer = cls(
            d_model, H, head_dim=D, layer_idx=module.layer_idx,
            num_layers=module.num_hidden_layers, norm_eps=module.norm.variance_epsilon,
            slopes="minimax", scale=1.0,
        )  # fmt: skip
        q, k, v = module.qkv_proj.weight.view(H, 3, D, d_model).unbind(1)  # [H, D, d_model] each
        weights = {
            "q_proj.weight": q.reshape(H * D, d_model),
            "k_proj.weight": k.reshape(H * D, d_model),
            "v_proj.weight": v.reshape(H * D, d_model),
            "g_proj.weight": module.output_gate.weight,
            "o_norm.weight": module.norm.weight,
            "o_proj.weight": module.out_proj.weight,
        }
        return load(layer, weights, module.qkv_proj.weight)
