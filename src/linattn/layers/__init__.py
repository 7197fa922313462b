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
- ``LogLinearMamba2``: Mamba-2 with log-linear attention's Fenwick levels;
  ``LogLinearGatedDeltaNet``: Gated DeltaNet with the same levels.
- ``Mamba2``: the Mamba-2 mixer (SSD: scalar decay, Delta-scaled input, D skip, B/C groups).
- ``Comba``, ``GatedDeltaNet2``: the generalized delta rule's gated delta rules: a separate
  read key p and a corrected query (Comba); an erase gate per key channel and a write gate per
  value channel (Gated DeltaNet-2).
- ``RWKV7``: RWKV-7 "Goose" time mixing (token shift, LoRA gates, value residual, group norm
  and the current token's bonus) around the generalized delta rule.
- ``CyclicFlowAttention``: CyFA (fla 0.6.0's layer): two scalar-decay memories over clock slots
  with a softmax readout between them (``linattn.ops.cyfa``).
- ``HGRN2``: HGRN2 (GLA with keys 1 - f_t, the forget gate f_t its decay), as fla's
  ``HGRN2Attention``.
- ``MultiScaleRetention``: RetNet's retention (a constant decay per head, RoPE, swish gate), as
  fla's ``MultiScaleRetention``.
- ``LightNet``: LightNet (GLA with keys a softmax over time), as fla's ``LightNetAttention``.
- ``RuleMixer``: any registered rule (a user's too) with a gate, its inputs projected from x
  into the ranges the rule declares.
- ``GatedSlotAttention``, ``ABCAttention``: two passes over m memory slots with a softmax over
  the slots between them (GSA, ABC), as fla's layers.
- ``GatedOja``: the gated Oja rule (a per-value-channel decay, Oja's Hebbian write), linattn's
  recurrent block around ``linattn.ops.gated_oja_rule`` (fla has no layer for it).
- ``TTTLinear``, ``Titans``: memories trained at test time by a gradient step per mini-batch
  (TTT-Linear; Titans' linear memory with momentum and forgetting), linattn's recurrent block
  around ``linattn.ops.ttt`` / ``linattn.ops.titans`` (fla has no layer for either).
- ``ForgettingAttentionMixer``: FoX's forgetting attention with a KV cache (the
  ``"forgetting"`` mixer of ``LMConfig``).
- ``GatedConvolution``: not a mechanism; a gated short convolution (Zoology's BaseConv), the
  block the MQAR models put in front of each mechanism.
- ``LightningAttention``: lightning attention (a constant decay per head, fla's slopes or
  MiniMax-01's; the MiniMax-01 layer: SiLU q, k, v, a norm and a sigmoid output gate), built
  with the weights of transformers' ``MiniMaxLightningAttention`` (fla has no layer).
- ``HGRN``: HGRN's element-wise gated recurrence, as fla's ``HGRNAttention``.
- ``Based``, ``ReBased``: normalised linear attention with Based's Taylor kernel / ReBased's
  learned squared kernel, as fla's ``BasedLinearAttention`` / ``ReBasedLinearAttention``.
- ``RWKV4``: RWKV-4's time mixing (token shift, WKV with its bonus, receptance), built with the
  weights of transformers' ``RwkvSelfAttention`` (fla has no layer).
- ``RWKV6``: RWKV-6 "Finch" time mixing (data-dependent token shift, LoRA decay, bonus, group
  norm and SiLU gate), as fla's ``RWKV6Attention``.
- ``StickBreakingAttention``: stick-breaking attention with a KV cache, as fla's layer.
- ``IPLR``, ``DPLR``: the generalized delta rule's identity / diagonal plus low rank transitions
  as a delta rule with a learning rate per key channel (and KDA's decay: DPLR) in DeltaNet's
  layer (fla has the ops only).
"""

from linattn.layers.based import Based, ReBased
from linattn.layers.conv import GatedConvolution
from linattn.layers.cyfa import CyclicFlowAttention
from linattn.layers.delta import DeltaNet, GatedDeltaNet, KimiDeltaAttention
from linattn.layers.delta_product import GatedDeltaProduct
from linattn.layers.deltaformer import DeltaFormer
from linattn.layers.forgetting import ForgettingAttentionMixer
from linattn.layers.gated_attention import GatedAttention
from linattn.layers.generalized_delta import Comba, GatedDeltaNet2
from linattn.layers.hgrn import HGRN
from linattn.layers.hgrn2 import HGRN2
from linattn.layers.lightnet import LightNet
from linattn.layers.lightning import LightningAttention
from linattn.layers.linear import GatedLinearAttention, LinearAttention
from linattn.layers.log_linear import LogLinearGatedDeltaNet, LogLinearMamba2
from linattn.layers.mamba2 import Mamba2
from linattn.layers.mesa import MesaNet
from linattn.layers.mixer import TokenMixer
from linattn.layers.mla import MultiHeadLatentAttention
from linattn.layers.modules import DecayGate, GatedRMSNorm, LoRA, ShortConvolution
from linattn.layers.momentum import MomentumDeltaNet
from linattn.layers.oja import GatedOja
from linattn.layers.path import PaTHAttention
from linattn.layers.plr import DPLR, IPLR
from linattn.layers.precond import PrecondGatedDeltaNet, PrecondKDA
from linattn.layers.recurrent import RecurrentMixer
from linattn.layers.retention import MultiScaleRetention
from linattn.layers.rule_mixer import RuleMixer
from linattn.layers.rwkv4 import RWKV4
from linattn.layers.rwkv6 import RWKV6
from linattn.layers.rwkv7 import RWKV7
from linattn.layers.slots import ABCAttention, GatedSlotAttention
from linattn.layers.softmax import SoftmaxAttention
from linattn.layers.stickbreaking import StickBreakingAttention
from linattn.layers.ttt import Titans, TTTLinear

__all__ = [
    "ABCAttention",
    "Comba",
    "CyclicFlowAttention",
    "DecayGate",
    "DeltaFormer",
    "DeltaNet",
    "ForgettingAttentionMixer",
    "GatedAttention",
    "GatedConvolution",
    "GatedDeltaNet",
    "GatedDeltaNet2",
    "GatedDeltaProduct",
    "GatedLinearAttention",
    "GatedRMSNorm",
    "GatedSlotAttention",
    "HGRN2",
    "KimiDeltaAttention",
    "LightNet",
    "LoRA",
    "LinearAttention",
    "LogLinearGatedDeltaNet",
    "LogLinearMamba2",
    "MultiHeadLatentAttention",
    "MultiScaleRetention",
    "Mamba2",
    "PaTHAttention",
    "MesaNet",
    "MomentumDeltaNet",
    "PrecondGatedDeltaNet",
    "PrecondKDA",
    "RecurrentMixer",
    "RWKV7",
    "RuleMixer",
    "ShortConvolution",
    "SoftmaxAttention",
    "TokenMixer",
    "GatedOja",
    # test-time-training memories
    "TTTLinear",
    "Titans",
    # lightning attention, HGRN, Based, ReBased, RWKV-4, RWKV-6, stick-breaking attention, IPLR,
    # DPLR
    "LightningAttention",
    "HGRN",
    "Based",
    "ReBased",
    "RWKV4",
    "RWKV6",
    "StickBreakingAttention",
    "IPLR",
    "DPLR",
]
