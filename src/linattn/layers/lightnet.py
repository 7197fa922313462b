"""``LightNet``: LightNet's token mixer (Qin et al. 2024, "You Only Scan Once: Efficient
Multi-dimension Sequential Modeling with LightNet"), as fla 0.6.0's ``LightNetAttention`` defines
it:

    q = silu(W_q x),  k = W_k x (key logits),  v = W_v x           (no short convolution)
    z_t = log(exp(z_{t-1}) + exp(k_t))                             (per key channel)
    S_t = Diag(exp(z_{t-1} - z_t)) S_{t-1} + exp(k_t - z_t) v_t^T
    o_t = S_t^T q_t / sqrt(K)                                      (GLA, spec section 10)
    y = W_o (rmsnorm(o) * weight * silu(W_g2 W_g1 x))              (one norm over all heads)

The norm's epsilon is 1e-6: fla's layer calls its fused norm-gate-linear kernel without its
``g_norm``'s eps (``norm_eps``), so the kernel's default 1e-6 is what it computes.

The keys' log-normaliser z is part of the decoding state (``"z"``, -inf before any token). GLA
reparametrised (registry entry "lightnet"): the keys and gates of
``linattn.compat.lightnet.lightnet_gate``, then ``linattn.ops.linear_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn import ops
from linattn.compat.lightnet import lightnet_gate
from linattn.layers._reference import check_type, load, require
from linattn.layers.hgrn2 import WidthRMSNorm
from linattn.layers.mixer import State, StateSpec
from linattn.layers.recurrent import RecurrentMixer


class LightNet(RecurrentMixer):
    """LightNet (the module docstring).

    Args (besides ``chunk_size`` and ``mode`` of ``RecurrentMixer``): ``d_model``, ``n_heads``;
    ``expand_ratio``: key channels per head (fla's; default d_model // n_heads);
    ``gate_low_rank_dim``: the output gate's rank (fla's 128); ``norm_eps``: 1e-6 (what fla's
    layer computes, the module docstring). fla's short
    convolutions (without activation) are not computed.
    """

    silu_without_conv = False  # q's SiLU is LightNet's own; k and v enter as projected

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        expand_ratio: int | None = None,
        gate_low_rank_dim: int = 128,
        norm_eps: float = 1e-6,
        **kwargs,
    ) -> None:
        for name in ("short_conv", "output_gate", "head_dim", "key_dim", "num_v_heads"):
            if name in kwargs:
                raise TypeError(f"LightNet does not take {name} (fla's LightNetAttention has none)")
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        key_dim = d_model // n_heads if expand_ratio is None else expand_ratio
        super().__init__(
            d_model, n_heads, d_model // n_heads, key_dim, short_conv=False, output_gate=True,
            gate_rank=gate_low_rank_dim, norm_eps=norm_eps, **kwargs,
        )  # fmt: skip
        self.o_norm = WidthRMSNorm(d_model, norm_eps)
        self._z: Tensor | None = None

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``RecurrentMixer``'s, and ``z``: the keys' log-normaliser [B, 1, H, K] (float32, float64
        for float64 models), -inf in a new state."""
        S_dtype = super().state_spec(batch_size, dtype)["S"][1]
        shape = (batch_size, 1, self.n_heads, self.key_dim)
        return {**super().state_spec(batch_size, dtype), "z": (shape, S_dtype)}

    def new_state(self, batch_size, dtype, device=None) -> State:
        state = super().new_state(batch_size, dtype, device)
        state["z"].fill_(float("-inf"))
        return state

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        self._z = None if state is None else state["z"]
        y, new = super().mix(x, None if state is None else {"S": state["S"]})
        if new is not None:
            new["z"] = self._z
        return y, new

    def recurrence(self, x, q, k, v, mode, S, keep):
        key, g, self._z = lightnet_gate(k, self._z)  # a new state's z = -inf: no prior mass
        return ops.linear_attention(
            F.silu(q), key, v, g, mode=mode, chunk_size=self.chunk_size, initial_state=S,
            output_final_state=keep,
        )  # fmt: skip

    @classmethod
    def from_fla(cls, module: nn.Module) -> LightNet:
        """Our LightNet with the options and weights of fla's ``LightNetAttention`` layer."""
        check_type(module, "LightNetAttention", "fla")
        require(module, use_short_conv=False)
        if module.g_norm.weight is None or module.g_norm.bias is not None:
            raise ValueError("only fla's LightNetAttention with a norm weight and no bias")
        layer = cls(
            module.hidden_size, module.num_heads, expand_ratio=module.expand_ratio,
            gate_low_rank_dim=module.gate_low_rank_dim, norm_eps=1e-6,  # the kernel's, not g_norm's
        )  # fmt: skip
        weights = {
            "q_proj.weight": module.q_proj.weight,
            "k_proj.weight": module.k_proj.weight,
            "v_proj.weight": module.v_proj.weight,
            "g_proj.0.weight": module.g_proj[0].weight,
            "g_proj.1.weight": module.g_proj[1].weight,
            "o_proj.weight": module.o_proj.weight,
            "o_norm.weight": module.g_norm.weight,
        }
        return load(layer, weights, module.q_proj.weight)
