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
- ``Comba``, ``GatedDeltaNet2``: the generalized delta rule's gated delta rules: a separate
  read key p and a corrected query (Comba); an erase gate per key channel and a write gate per
  value channel (Gated DeltaNet-2).
- ``RWKV7``: RWKV-7 "Goose" time mixing (token shift, LoRA gates, value residual, group norm
  and the current token's bonus) around the generalized delta rule.
- ``RuleMixer``: any registered rule (a user's too) with a gate, its inputs projected from x
  into the ranges the rule declares.
- ``GatedConvolution``: not a mechanism; a gated short convolution (Zoology's BaseConv), the
  block the MQAR models put in front of each mechanism.
"""

from linattn.layers.conv import GatedConvolution
from linattn.layers.delta import DeltaNet, GatedDeltaNet, KimiDeltaAttention
from linattn.layers.delta_product import GatedDeltaProduct
from linattn.layers.gated_attention import GatedAttention
from linattn.layers.generalized_delta import Comba, GatedDeltaNet2
from linattn.layers.linear import GatedLinearAttention, LinearAttention
from linattn.layers.mamba2 import Mamba2
from linattn.layers.mixer import TokenMixer
from linattn.layers.mla import MultiHeadLatentAttention
from linattn.layers.modules import DecayGate, GatedRMSNorm, LoRA, ShortConvolution
from linattn.layers.momentum import MomentumDeltaNet
from linattn.layers.precond import PrecondGatedDeltaNet, PrecondKDA
from linattn.layers.recurrent import RecurrentMixer
from linattn.layers.rule_mixer import RuleMixer
from linattn.layers.rwkv7 import RWKV7
from linattn.layers.softmax import SoftmaxAttention

__all__ = [
    "Comba",
    "DecayGate",
    "DeltaNet",
    "GatedAttention",
    "GatedConvolution",
    "GatedDeltaNet",
    "GatedDeltaNet2",
    "GatedDeltaProduct",
    "GatedLinearAttention",
    "GatedRMSNorm",
    "KimiDeltaAttention",
    "LoRA",
    "LinearAttention",
    "MultiHeadLatentAttention",
    "Mamba2",
    "MomentumDeltaNet",
    "PrecondGatedDeltaNet",
    "PrecondKDA",
    "RecurrentMixer",
    "RWKV7",
    "RuleMixer",
    "ShortConvolution",
    "SoftmaxAttention",
    "TokenMixer",
]
