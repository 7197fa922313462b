"""``GatedConvolution``: a short causal convolution gated by a projection of the same token.

    y_t = (W x_t + b) * (h * x)_t,    (h * x)_t = sum_{i < k} h_i x_{t - k + 1 + i}  (per channel)

Not a mechanism of the spec: it keeps no memory beyond its last ``k - 1`` inputs and recalls
nothing. It is the "BaseConv" block of Arora et al. (2023), "Zoology" (arXiv 2312.04927), whose
associative-recall models put one in front of each sequence mixer; its product of a projection of
token t with a filtered window of the tokens before t gives the next layer bigram features (which
key precedes this value), which is what a recurrent memory then stores. ``linattn mqar`` builds
its models that way (``("conv", mechanism)``).

Written from the formula above, without an activation, with kernel ``k`` = 3 by default as in
Zoology's MQAR models; the projection gets the model's initialisation (``CausalLM``: normal(0,
0.02), zero bias), the filter nn.Conv1d's. Its generation state is the last
``k - 1`` inputs, ``conv``: [B, d_model, k - 1]; prompt and decoding give the outputs of one call.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn.layers.mixer import State, StateSpec, TokenMixer
from linattn.layers.modules import ShortConvolution


class GatedConvolution(TokenMixer):
    """``y = (W x + b) * conv(x)``: a depthwise causal convolution of kernel ``kernel_size``
    (no activation), gated elementwise by a linear projection with bias. x, y: [B, T, d_model]."""

    def __init__(self, d_model: int, kernel_size: int = 3, chunk_size: int = 64) -> None:
        super().__init__(d_model, chunk_size)
        self.proj = nn.Linear(d_model, d_model)
        self.conv = ShortConvolution(d_model, kernel_size, activation=None)

    def state_spec(self, batch_size: int, dtype: torch.dtype) -> StateSpec:
        """``conv``: the last ``kernel_size - 1`` inputs, [B, d_model, kernel_size - 1]."""
        return {"conv": (self.conv.state_shape(batch_size), dtype)}

    def mix(self, x: Tensor, state: State | None) -> tuple[Tensor, State | None]:
        filtered, conv_state = self.conv(x, None if state is None else state["conv"])  # [B, T, d]
        y = self.proj(x) * filtered
        return y, None if state is None else {"conv": conv_state}
