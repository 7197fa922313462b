"""A small causal language model over the mixers of ``linattn.layers``, hybrids included.

Example::

    >>> import torch
    >>> from linattn.models import CausalLM, LMConfig, preset
    >>> model = CausalLM(LMConfig(vocab_size=256, mixers=("kda", "kda", "kda", "softmax")))
    >>> kimi_linear = CausalLM(preset("kimi_linear"))  # 3 KDA : 1 MLA, the model's layout
    >>> prompt = torch.randint(0, 256, (1, 8))
    >>> ids = model.generate(prompt, max_new_tokens=32, temperature=0.8, top_k=50, seed=0)
"""

from linattn.models.cache import Cache
from linattn.models.config import ATTENTION_MIXERS, AUXILIARY_MIXERS, MIXERS, LMConfig
from linattn.models.lm import Block, CausalLM, SwiGLU, sample
from linattn.models.mixers import build_mixer
from linattn.models.presets import PRESETS, preset, softmax_counterpart

__all__ = [
    "ATTENTION_MIXERS",
    "AUXILIARY_MIXERS",
    "MIXERS",
    "PRESETS",
    "Block",
    "Cache",
    "CausalLM",
    "LMConfig",
    "SwiGLU",
    "build_mixer",
    "preset",
    "sample",
    "softmax_counterpart",
]
