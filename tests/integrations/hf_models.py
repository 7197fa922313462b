"""Tiny transformers models of each linear-attention family, random weights, nothing downloaded.

Also transformers' own CPU path: ``own_path(model_module)`` binds a modeling module's kernel names
to the pure-PyTorch fallbacks transformers wraps (``wrapper.__wrapped__``), what it runs when fla,
mamba-ssm and causal-conv1d are absent, whatever this machine has installed.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch

from linattn.integrations import transformers as hf

VOCAB = 61


def qwen3_next(**sizes: int):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # grouped value heads: G = 2
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        **sizes,
    )
    return Qwen3NextForCausalLM(config)


def qwen3_5(**sizes: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        **sizes,
    )
    return Qwen3_5ForCausalLM(config)


def kimi_linear(**sizes: int):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    config = KimiLinearConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse"],
        num_attention_heads=2,
        num_key_value_heads=2,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        num_experts=4,
        num_experts_per_token=2,
        linear_num_heads=2,
        linear_head_dim=8,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **sizes,
    )
    return KimiLinearForCausalLM(config)


def mamba2(**sizes: int):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=8,
        state_size=8,
        n_groups=2,
        expand=2,
        chunk_size=8,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **sizes,
    )
    return Mamba2ForCausalLM(config)


BUILDERS = {
    "qwen3_next": qwen3_next,
    "qwen3_5": qwen3_5,
    "kimi_linear": kimi_linear,
    "mamba2": mamba2,
}


def build(family: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny model of the family in eval mode, its weights drawn from `seed`."""
    torch.manual_seed(seed)
    model = BUILDERS[family]()
    with torch.no_grad():  # stronger gates than the init's, so that every term matters
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
    return model.to(dtype).eval()


@contextlib.contextmanager
def own_path(family: str) -> Iterator[None]:
    """transformers' pure-PyTorch kernels bound in the family's modeling module, then restored."""
    module = importlib.import_module(hf.module_name(family))
    bound = {name: module.__dict__[name] for name in hf.FAMILIES[family] if name in module.__dict__}
    try:
        for name, wrapper in bound.items():
            setattr(module, name, wrapper.__wrapped__)
        yield
    finally:
        for name, wrapper in bound.items():
            setattr(module, name, wrapper)
