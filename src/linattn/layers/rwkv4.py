"""``RWKV4``: RWKV-4's time mixing (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer
Era", section 4.1, eqs. 11-14), per channel c of the C attention channels (d_model by default):

    x'_t = mu * x_t + (1 - mu) * x_{t-1}       (token shift; mu_r, mu_k, mu_v; x_0 = 0)
    r_t, k_t, v_t = W_r x'^r_t, W_k x'^k_t, W_v x'^v_t
    wkv_t = (a_{t-1} + exp(u + k_t) v_t) / (b_{t-1} + exp(u + k_t))
    a_t = exp(-exp(w)) a_{t-1} + exp(k_t) v_t,    b_t = exp(-exp(w)) b_{t-1} + exp(k_t)
    y = W_o (sigmoid(r_t) * wkv_t)

with the decay w (``time_decay``; the per-token decay exp(-exp(w)), as the RWKV-4 code and fla
parametrise it) and the bonus u (``time_first``). The WKV is ``linattn.compat.rwkv4.wkv``
(registry entry "rwkv4": RWKV-6's additive memory per channel, spec section 10), whose state
(alpha, beta, eps) [B, 3, 1, C] keeps a and b relative to a running maximum eps of the keys. The
decoding state is that and the last token's x (``"shift"``). fla 0.6.0 has the op but no RWKV-4
layer, so there is no ``from_fla``; the parameter names are the RWKV-4 code's, and
``from_transformers`` builds the layer with the weights of transformers' ``RwkvSelfAttention``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from linattn.compat.rwkv4 import wkv
from linattn.dtypes import compute_dtype
from linattn.layers._reference import check_type, load
from linattn.layers.mixer import State, StateSpec, TokenMixer, check_positive, state_dtype

if TYPE_CHECKING:
    from linattn.models.config import LMConfig

# The running maximum before any token: the WKV state's eps of a new sequence (fla's -1e38).
EMPTY_EPS = -1e38


class RWKV4(TokenMixer):
    """RWKV-4 time mixing (the module docstring). Args: ``d_model``; ``attention_size``: C, the
    WKV's channels (default d_model; transformers' ``attention_hidden_size``); ``chunk_size``:
    the WKV's chunk form's block length. Parameters: ``time_decay`` w, ``time_first`` u [C],
    ``time_mix_k``, ``time_mix_v``, ``time_mix_r`` [d_model]; ``key``, ``value``,
    ``receptance`` (d_model -> C), ``output`` (C -> d_model), no bias. Initialised with decays
    spread over the channels (w from -5 to 3, as the RWKV-4 code's first layer), the bonus
    log 0.3 and mixes rising from 0 to 1 over the channels."""

    def __init__(
        self, d_model: int, *, attention_size: int | None = None, chunk_size: int = 64
    ) -> None:
        super().__init__(d_model, chunk_size)
        C = d_model if attention_size is None else attention_size
        check_positive("attention_size", C)
        self.attention_size = C
        ramp = torch.arange(C, dtype=torch.float64) / max(C - 1, 1)  # 0 .. 1 over the channels
        mix = torch.arange(d_model, dtype=torch.float64) / max(d_model - 1, 1)
        self.time_decay = nn.Parameter((-5 + 8 * ramp**0.7).float())
        self.time_first = nn.Parameter(torch.full((C,), float(torch.tensor(0.3).log())))
        self.time_mix_k = nn.Parameter(mix.float().clone())
        self.time_mix_v = nn.Parameter((mix * 0.9 + 0.1).float())
        self.time_mix_r = nn.Parameter(mix.sqrt().float())
        self.key = nn.Linear(d_model, C, bias=False)
        self.value = nn.Linear(d_model, C, bias=False)
        self.receptance = nn.Linear(d_model, C, bias=False)
        self.output = nn.Linear(C, d_model, bias=False)

    @classmethod
    def from_config(cls, config: LMConfig) -> RWKV4:
        """The mixer ``"rwkv4"`` of ``LMConfig.mixers``: ``d_model`` and ``chunk_size`` (RWKV-4's
        WKV has no heads: ``n_heads`` is not read)."""
        kwargs = {} if config.chunk_size is None else {"chunk_size": config.chunk_size}
        return cls(config.d_model, **kwargs)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``wkv``: (alpha, beta, eps) [B, 3, 1, C], float32 (float64 for a float64 model);
        ``shift``: the last token's x [B, d_model], the model's dtype."""
        return {
            "wkv": ((batch_size, 3, 1, self.attention_size), state_dtype(dtype)),
            "shift": ((batch_size, self.d_model), dtype),
        }

    def new_state(self, batch_size, dtype, device=None) -> State:
        """Zeros, but the running maximum eps at ``EMPTY_EPS`` (no key seen)."""
        state = super().new_state(batch_size, dtype, device)
        state["wkv"][:, 2].fill_(EMPTY_EPS)
        return state

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        B, T, _ = x.shape
        cd = compute_dtype(x.dtype)
        start = self.new_state(B, x.dtype, x.device) if state is None else state
        previous = torch.cat([start["shift"][:, None], x[:, :-1]], 1)  # x_{t-1}, x_0 = 0

        def shifted(mu: Tensor) -> Tensor:
            return x * mu + previous * (1 - mu)

        k = self.key(shifted(self.time_mix_k)).to(cd)
        v = self.value(shifted(self.time_mix_v)).to(cd)
        r = self.receptance(shifted(self.time_mix_r))
        out, S = wkv(
            self.time_decay.to(cd), self.time_first.to(cd), k, v, start["wkv"].to(cd),
            mode=self.pick_mode(T, state), chunk_size=self.chunk_size,
        )  # fmt: skip
        y = self.output(torch.sigmoid(r) * out.to(x.dtype))
        new = None
        if state is not None:
            new = {"wkv": S.to(state_dtype(x.dtype)), "shift": x[:, -1]}
        return y, new

    @classmethod
    def from_transformers(cls, module: nn.Module) -> RWKV4:
        """Our layer with the sizes and weights of transformers' ``RwkvSelfAttention`` (its
        ``time_mix_key``, ``time_mix_value``, ``time_mix_receptance`` [1, 1, d_model] as ours)."""
        check_type(module, "RwkvSelfAttention", "transformers")
        d_model, C = module.key.in_features, module.attention_hidden_size
        layer = cls(d_model, attention_size=C)
        weights = {
            "time_decay": module.time_decay,
            "time_first": module.time_first,
            "time_mix_k": module.time_mix_key.reshape(d_model),
            "time_mix_v": module.time_mix_value.reshape(d_model),
            "time_mix_r": module.time_mix_receptance.reshape(d_model),
            **{f"{n}.weight": getattr(module, n).weight
               for n in ("key", "value", "receptance", "output")},
        }  # fmt: skip
        return load(layer, weights, module.key.weight)
