"""The model presets: their layouts, their counterparts, and generation through their caches."""

from __future__ import annotations

import pytest
import torch

from linattn.models import PRESETS, CausalLM, preset, softmax_counterpart

# The presets at a width a test runs in milliseconds (the layouts and ratios kept).
TINY = dict(d_model=32, n_heads=2, head_dim=8, kv_lora_rank=16, qk_rope_head_dim=4, chunk_size=4)


def test_layouts():
    kimi, qwen, gdn = preset("kimi_linear"), preset("qwen3_next"), preset("gated_deltanet")
    assert kimi.mixers == ("kda", "kda", "kda", "mla") * 2 and kimi.rope is False  # NoPE
    assert kimi.kv_lora_rank == 4 * kimi.head_size and kimi.qk_rope_head_dim == kimi.head_size // 2
    assert qwen.mixers.count("gated_deltanet") == 3 * qwen.mixers.count("gated_attention")
    assert qwen.num_v_heads == 2 * qwen.n_heads and qwen.partial_rotary_factor == 0.25
    assert gdn.mixers == ("gated_deltanet",) * 4 and gdn.expand_v == 2.0
    assert preset("kimi_linear", vocab_size=100, d_model=64).d_model == 64
    with pytest.raises(ValueError, match="unknown preset 'kimi'"):
        preset("kimi")


def test_counterparts_replace_every_block_by_the_attention_block():
    assert softmax_counterpart(preset("kimi_linear")).mixers == ("mla",) * 8
    assert softmax_counterpart(preset("qwen3_next")).mixers == ("gated_attention",) * 8
    assert softmax_counterpart(preset("gated_deltanet")).mixers == ("softmax",) * 4
    counterpart = softmax_counterpart(preset("kimi_linear"))
    assert (counterpart.d_model, counterpart.kv_lora_rank) == (256, 256)


@pytest.mark.parametrize("name", PRESETS)
def test_prefill_then_decode_equals_one_forward(name):
    torch.manual_seed(0)
    model = CausalLM(preset(name, vocab_size=37, **TINY)).double()
    ids = torch.randint(0, 37, (2, 9))
    full = model(ids)
    cache = model.new_cache(2)
    logits = [model(ids[:, :5], cache=cache)]
    for t in range(5, 9):
        logits.append(model(ids[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=0, atol=1e-10)
    out = model.generate(ids[:, :3], max_new_tokens=4, temperature=0)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], ids[:, :3])
