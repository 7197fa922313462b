"""Tiny transformers models of each linear-attention family, random weights, nothing downloaded.

Also transformers' own CPU path: ``own_path(model_module)`` binds a modeling module's kernel names
to the pure-PyTorch fallbacks transformers wraps (``wrapper.__wrapped__``), what it runs when fla,
mamba-ssm and causal-conv1d are absent, whatever this machine has installed.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator

import torch

from linattn.integrations import transformers as hf

VOCAB = 61


def _qwen_linear(**sizes: int) -> dict:
    """The sizes Qwen3-Next and Qwen3.5 share: one gated-delta layer (grouped value heads,
    G = 2), then one full-attention layer."""
    return dict(
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
        experts_implementation="eager",  # grouped_mm has no float64
        **sizes,
    )


def qwen3_next(**sizes: int):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    experts = dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    return Qwen3NextForCausalLM(Qwen3NextConfig(**_qwen_linear(**experts, **sizes)))


def qwen3_5(**sizes: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_qwen_linear(**sizes)))


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
        experts_implementation="eager",  # grouped_mm has no float64
        **sizes,
    )
    return KimiLinearForCausalLM(config)


def mamba2(**sizes: object):
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
        experts_implementation="eager",  # grouped_mm has no float64
        **sizes,
    )
    return Mamba2ForCausalLM(config)


BUILDERS = {
    "qwen3_next": qwen3_next,
    "qwen3_5": qwen3_5,
    "kimi_linear": kimi_linear,
    "mamba2": mamba2,
}


def build(family: str, dtype: torch.dtype = torch.float32, seed: int = 0, **config: object):
    """A tiny model of the family in eval mode, its weights drawn from `seed`; config: settings
    over the builder's (e.g. ``hidden_act``)."""
    torch.manual_seed(seed)
    model = BUILDERS[family](**config)
    with torch.no_grad():  # stronger gates than the init's, so that every term matters
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
    return model.to(dtype).eval()


def fla_bound() -> bool:
    """Whether transformers bound fla's kernels in Qwen3-Next's modeling module."""
    module = importlib.import_module(hf.module_name("qwen3_next"))
    wrapper = module.torch_chunk_gated_delta_rule
    return inspect.getclosurevars(wrapper).nonlocals.get("is_new_implementation", False)


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


@contextlib.contextmanager
def float32_promoted() -> Iterator[None]:
    """Every float32 cast (``x.float()``, ``x.to(torch.float32)``) gives float64 instead.

    transformers' modeling code and its kernels cast to float32 on purpose (norms, gates, states),
    so a float64 model still rounds there; with the casts promoted, its own path and linattn's
    both compute in float64 and must agree to 1e-12.
    """
    to, to_float = torch.Tensor.to, torch.Tensor.float

    def promoted(x: object) -> object:
        return torch.float64 if x is torch.float32 else x

    def to64(self, *args, **kwargs):
        args = tuple(promoted(a) for a in args)
        kwargs = {k: promoted(v) for k, v in kwargs.items()}
        return to(self, *args, **kwargs)

    def float64(self, *args, **kwargs):
        return to(self, torch.float64)

    torch.Tensor.to, torch.Tensor.float = to64, float64
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float = to, to_float


def decode(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of a prefill of `prefill` tokens, then one token at a time with the model's cache."""
    out = model(ids[:, :prefill], use_cache=True)
    logits = [out.logits]
    name = "cache_params" if hasattr(out, "cache_params") else "past_key_values"  # Mamba-2's
    for t in range(prefill, ids.shape[1]):
        out = model(ids[:, t : t + 1], use_cache=True, **{name: getattr(out, name)})
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


def generate(model, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy generation: the tokens and the logits of every generated step."""
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
    )
    return out.sequences, torch.stack(out.logits, dim=1)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return ((a - b).abs().max() / b.abs().max()).item()


TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-12}


def compare(family: str, dtype: torch.dtype, seed: int = 0, **config: object) -> dict[str, float]:
    """linattn (``apply``) against transformers' own CPU path on one tiny model.

    Logits of a batch of 2 x 37 tokens, a prefill of 21 then 16 decoded tokens, and 6 greedy
    tokens of ``generate``; returns each relative difference (and asserts the tokens agree).
    """
    import copy

    model = build(family, dtype, seed, **config)
    ours = hf.apply(copy.deepcopy(model))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 37), generator=generator)
    promote = float32_promoted() if dtype == torch.float64 else contextlib.nullcontext()
    with torch.no_grad(), promote:
        with own_path(family):
            ref = [model(ids).logits, decode(model, ids, 21), generate(model, ids[:, :9], 6)]
        got = [ours(ids).logits, decode(ours, ids, 21), generate(ours, ids[:, :9], 6)]
    assert torch.equal(got[2][0], ref[2][0]), "generate: different tokens"
    return {
        "logits": relative(got[0], ref[0]),
        "decode": relative(got[1], ref[1]),
        "generate": relative(got[2][1], ref[2][1]),
    }
