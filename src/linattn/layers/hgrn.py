"""``HGRN``: HGRN's token mixer (Qin, Yang and Zhong 2023, "Hierarchically Gated Recurrent Neural
Network for Sequence Modeling", section 3.1), as fla 0.6.0's ``HGRNAttention`` defines it:

    f_t = logsigmoid(W_f x_t),  i_t = silu(W_i x_t) * (1 - exp(f_t))   (no short convolution)
    h_t = exp(f_t) * h_{t-1} + i_t                                       (per channel, D' of them)
    y = W_o (rmsnorm(h) * weight * silu(W_g x))                          (one norm over D')

with D' = ``expand_ratio`` * d_model channels. Each channel is one head of linear attention with
K = V = 1, q = k = 1 and a scalar decay (registry entry "hgrn", spec section 10), computed by
``linattn.compat.hgrn.hgrn``. fla's model also passes each layer a learned lower bound on the
forget gate (``lower_bound``); fla's layer alone, and this one, has none. The decoding state is
h [B, D'].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.compat.hgrn import hgrn
from linattn.layers._reference import check_type, load, require
from linattn.layers.hgrn2 import WidthRMSNorm
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype

if TYPE_CHECKING:
    from linattn.models.config import LMConfig


class HGRN(TokenMixer):
    """HGRN (the module docstring). Args: ``d_model``; ``expand_ratio``: D' / d_model (fla's,
    default 1); ``norm_eps``: the output norm's epsilon (fla's 1e-5); ``chunk_size``: the
    chunk form's block length. Parameters are named as fla's (``i_proj``, ``f_proj``,
    ``g_proj``, ``g_norm``, ``o_proj``)."""

    def __init__(
        self,
        d_model: int,
        *,
        expand_ratio: int = 1,
        norm_eps: float = 1e-5,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, chunk_size)
        check_positive("expand_ratio", expand_ratio)
        self.expand_ratio = expand_ratio
        self.width = D = d_model * expand_ratio
        self.i_proj = nn.Linear(d_model, D, bias=False)
        self.f_proj = nn.Linear(d_model, D, bias=False)
        self.g_proj = nn.Linear(d_model, D, bias=False)
        self.g_norm = WidthRMSNorm(D, norm_eps)
        self.o_proj = nn.Linear(D, d_model, bias=False)

    @classmethod
    def from_config(cls, config: LMConfig) -> HGRN:
        """The mixer ``"hgrn"`` of ``LMConfig.mixers``: the config's ``norm_eps`` and
        ``chunk_size`` (HGRN has no heads: ``n_heads`` is not read)."""
        kwargs = {} if config.chunk_size is None else {"chunk_size": config.chunk_size}
        return cls(config.d_model, norm_eps=config.norm_eps, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``S``: the hidden state h [B, D'], float32 (float64 for a float64 model)."""
        return {"S": ((batch_size, self.width), state_dtype(dtype))}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        f = F.logsigmoid(self.f_proj(x))
        i = F.silu(self.i_proj(x)) * -torch.expm1(f)  # 1 - exp(f), without its cancellation
        mode = self.pick_mode(x.shape[1], state)
        h, S = hgrn(
            i, f, None if state is None else state["S"], output_final_state=state is not None,
            mode=mode, chunk_size=self.chunk_size,
        )  # fmt: skip
        o = self.g_norm(h.to(x.dtype).unsqueeze(-2), self.g_proj(x).unsqueeze(-2)).squeeze(-2)
        new = None if state is None else {"S": S.to(state_dtype(x.dtype))}
        return self.o_proj(o), new

    @classmethod
    def from_fla(cls, module: nn.Module) -> HGRN:
        """Our HGRN with the options and weights of fla's ``HGRNAttention`` layer."""
        check_type(module, "HGRNAttention", "fla")
        require(module, use_short_conv=False)
        norm = module.g_norm
        if norm.weight is None or getattr(norm, "bias", None) is not None:
            raise ValueError("only fla's HGRNAttention with a norm weight and no bias")
        if norm.activation not in ("swish", "silu"):  # its sigmoid gate is not computed here
            raise ValueError(
                f"HGRNAttention's g_norm.activation {norm.activation!r} is not supported"
            )
        if module.input_dim % module.hidden_size:
            raise ValueError("HGRNAttention's expand_ratio must be an integer")
        layer = cls(
            module.hidden_size, expand_ratio=module.input_dim // module.hidden_size,
            norm_eps=norm.eps,
        )  # fmt: skip
        weights = {
            "i_proj.weight": module.i_proj.weight,
            "f_proj.weight": module.f_proj.weight,
            "g_proj.weight": module.g_proj.weight,
            "g_norm.weight": norm.weight,
            "o_proj.weight": module.o_proj.weight,
        }
        return load(layer, weights, module.i_proj.weight)
