"""fla's ``LogLinearMamba2`` layer on the CPU, for ``linattn.integrations.fla``.

fla 0.6.0's ``LogLinearMamba2.forward`` refuses any device but CUDA (``NotImplementedError``),
though its ``cuda_kernels_forward`` is made of calls ``enable()`` rebinds: the log-linear op
(``chunk_log_linear_attn``, ``linattn.compat``), the short convolution, and the gated norms of
``fla.modules.norm.layernorm_gated`` (``rmsnorm_fn`` / ``layernorm_fn``, whose CPU versions are
in ``linattn.integrations._fla_modules``). ``forward`` is fla's with that path on the CPU too:
the layer's cache (``get_layer_cache`` / ``update_layer_cache``), the prefill, training and
one-token decoding.
"""

from __future__ import annotations

import torch


def log_linear_mamba2_forward(
    self,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    past_key_values: object | None = None,
    use_cache: bool | None = False,
    output_attentions: bool | None = False,
    **kwargs: object,
):
    """``LogLinearMamba2.forward`` on the CPU: the layer's cached state in, its fused path
    (``cuda_kernels_forward``, every kernel of which ``enable()`` rebinds), the state out."""
    from fla.layers.utils import get_layer_cache, update_layer_cache

    last_state = get_layer_cache(self, past_key_values)
    output, conv_state, state = self.cuda_kernels_forward(
        hidden_states, last_state, use_cache, attention_mask
    )
    update_layer_cache(self, past_key_values, recurrent_state=state, conv_state=conv_state,
                       offset=hidden_states.shape[1])  # fmt: skip
    return output, None, past_key_values
