"""Token mixers: ``nn.Module`` layers ``[B, T, d_model] -> [B, T, d_model]`` around the ops.

Each mixer's ``forward(x, state=None)`` returns ``(y, new_state)``; with a state (from
``mixer.new_state(batch_size, dtype)``) it advances it, running the op in chunk mode for a prompt
and in recurrent mode for a one-token decoding step.

- ``SoftmaxAttention``: causal, optional rotary embeddings; its state is the KV cache.
- ``LinearAttention``: a feature map, normalised or not, optional scalar or per-channel decay;
  ``GatedLinearAttention``: GLA as its paper and fla define the layer.
- ``DeltaNet``, ``GatedDeltaNet``, ``KimiDeltaAttention``: the delta rule, without decay, with a
  per-head decay, with a per-channel decay; ``GatedDeltaProduct``: n_h delta-rule writes a
  token (a product of n_h Householder transitions).
- ``MultiHeadLatentAttention``: softmax attention over a cached low-rank latent (MLA; NoPE
  available, as Kimi Linear's full-attention layers).
- ``GatedAttention``: Qwen3-Next's softmax attention with an output gate, q/k norms, partial
  rotary embeddings and grouped key/value heads.
- ``Mamba2``: the Mamba-2 mixer (SSD: scalar decay, Delta-scaled input, D skip, B/C groups).
- ``GatedConvolution``: not a mechanism; a gated short convolution (Zoology's BaseConv), the
  block the MQAR models put in front of each mechanism.
"""

from linattn.layers.conv import GatedConvolution
from linattn.layers.delta import DeltaNet, GatedDeltaNet, KimiDeltaAttention
from linattn.layers.delta_product import GatedDeltaProduct
from linattn.layers.gated_attention import GatedAttention
from linattn.layers.linear import GatedLinearAttention, LinearAttention
from linattn.layers.mamba2 import Mamba2
from linattn.layers.mixer import TokenMixer
from linattn.layers.mla import MultiHeadLatentAttention
from linattn.layers.modules import DecayGate, GatedRMSNorm, ShortConvolution
from linattn.layers.recurrent import RecurrentMixer
from linattn.layers.softmax import SoftmaxAttention

__all__ = [
    "DecayGate",
    "DeltaNet",
    "GatedAttention",
    "GatedConvolution",
    "GatedDeltaNet",
    "GatedDeltaProduct",
    "GatedLinearAttention",
    "GatedRMSNorm",
    "KimiDeltaAttention",
    "LinearAttention",
    "MultiHeadLatentAttention",
    "Mamba2",
    "RecurrentMixer",
    "ShortConvolution",
    "SoftmaxAttention",
    "TokenMixer",
]
