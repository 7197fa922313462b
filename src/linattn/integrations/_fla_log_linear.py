"""fla's ``LogLinearMamba2`` layer on the CPU (issue 52), for ``linattn.integrations.fla``.

fla 0.6.0's ``LogLinearMamba2.forward`` refuses any device but CUDA (``NotImplementedError``),
though its ``cuda_kernels_forward`` is made of calls ``enable()`` rebinds: the log-linear op
(``chunk_log_linear_attn``, ``linattn.compat``), the short convolution, and the gated norms of
``fla.modules.norm.layernorm_gated`` (``rmsnorm_fn`` / ``layernorm_fn``, Triton kernels), whose
CPU versions are here. ``forward`` is fla's with that path on the CPU too: the layer's cache
(``get_layer_cache`` / ``update_layer_cache``), the prefill, training and one-token decoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from linattn.dtypes import compute_dtype


def layernorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = False,
) -> torch.Tensor:
    """fla's gated (group) norm: ``y = norm(x) * weight + bias``, times ``silu(z)`` after the
    norm (``norm_before_gate``) or with x multiplied by ``silu(z)`` before it; the statistics
    over groups of ``group_size`` channels (None: all of them); RMS or mean-centred; computed
    in float32 for half precision, returned in x's dtype."""
    dtype = compute_dtype(x.dtype)
    h = x.to(dtype)
    gate = None if z is None else F.silu(z.to(dtype))
    if gate is not None and not norm_before_gate:
        h = h * gate
    groups = h.unflatten(-1, (-1, h.shape[-1] if group_size is None else group_size))
    if not is_rms_norm:
        groups = groups - groups.mean(-1, keepdim=True)
    y = (groups * torch.rsqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2)
    y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype)


def rmsnorm_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """fla's gated RMS norm (``RMSNormGated``): ``layernorm_fn`` with ``is_rms_norm``."""
    return layernorm_fn(x, weight, bias, z, eps, group_size, norm_before_gate, True)


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
