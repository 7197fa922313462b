"""linattn memory: cache bytes per block from the cache's own layout."""

from __future__ import annotations

import json

import pytest
import torch

from linattn import cli
from linattn.experiments import memory
from linattn.experiments.memory import compute_memory, human_bytes, memory_markdown
from linattn.models import CausalLM, LMConfig


def test_softmax_grows_with_t_and_the_others_do_not():
    config = LMConfig(vocab_size=10, d_model=64, n_heads=4, mixers=("softmax", "kda", "linear"))
    result = compute_memory(config, (10, 1000), torch.bfloat16)
    softmax, kda, linear = result["blocks"]
    # keys and values: 4 heads of 16 numbers per token, 2 bytes each
    assert softmax["bytes"][1] - softmax["bytes"][0] == 990 * 2 * 4 * 16 * 2
    assert kda["bytes"][0] == kda["bytes"][1] and linear["bytes"][0] == linear["bytes"][1]
    # float32 states: KDA 4 x 16 x 16, linear one more column; bfloat16 convolution state
    conv = 3 * 4 * 48 * 2
    assert kda["bytes"][0] == 4 * 16 * 16 * 4 + conv
    assert linear["bytes"][0] == 4 * 16 * 17 * 4 + conv
    assert result["total"] == [sum(b["bytes"][i] for b in result["blocks"]) for i in range(2)]


def test_numbers_agree_with_a_real_cache_after_t_tokens():
    config = LMConfig(vocab_size=10, d_model=32, n_heads=2, mixers=("gla", "softmax"))
    result = compute_memory(config, (7,), torch.float32)
    model = CausalLM(config)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.zeros(1, 7, dtype=torch.long), cache=cache)
    assert [b["bytes"][0] for b in result["blocks"]] == cache.nbytes_per_block()


def main(argv: list[str]) -> int:
    """``linattn ARGV`` through the real command line (every command registered)."""
    return cli.main(argv)


def test_command_prints_markdown_and_json(capsys):
    args = ["memory", "--d-model", "32", "--n-heads", "2", "--mixers", "kda,softmax"]
    assert main([*args, "--contexts", "16,1024"]) == 0
    text = capsys.readouterr().out
    assert "| 1 | softmax |" in text and "whole model" in text and "t = 1,024" in text
    assert main([*args, "--contexts", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [b["mixer"] for b in data["blocks"]] == ["kda", "softmax"]
    assert data["contexts"] == [16] and data["dtype"] == "bfloat16"
    assert memory_markdown(data).startswith("Generation cache")


def test_bad_arguments(capsys):
    assert main(["memory", "--d-model", "30", "--n-heads", "4"]) == 2
    assert "divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        main(["memory", "--mixers", "kda,mamba"])
    assert exit.value.code == 2
    assert "unknown mixers ['mamba']" in capsys.readouterr().err


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.500 KiB"
    assert human_bytes(3 * 2**30) == "3.000 GiB"


def kimi_linear_by_hand(config, t, kda_blocks, mla_blocks):
    """Bytes of a KDA/MLA model's cache after t tokens from the layer sizes (bfloat16 model):
    MLA keeps the latent and the shared key channels per token, KDA a float32 memory H x K x K
    and the short convolution's last 3 inputs of q, k, v."""
    H, K = config.n_heads, config.head_size
    mla = t * (config.kv_lora_rank + config.qk_rope_head_dim) * 2
    kda = H * K * K * 4 + 3 * (3 * H * K) * 2
    return kda_blocks * kda + mla_blocks * mla


def test_kimi_linear_reproduces_the_reports_kv_cache_reduction():
    """The Kimi Linear report: up to 75% less KV cache at 1M tokens than full MLA (3 KDA : 1
    MLA). Ours from the cache's layout, checked against the layer sizes by hand."""
    from linattn.models import preset, softmax_counterpart

    t = memory.KIMI_LINEAR_REPORT["context"]
    for config in (
        preset("kimi_linear"),
        # the released model's layer sizes (Kimi-Linear-48B: d 2304, 32 heads of 128, latent
        # rank 512, 64 shared key channels), in the same 3 : 1 layout
        preset(
            "kimi_linear",
            d_model=2304,
            n_heads=32,
            head_dim=128,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            mixers=("kda", "kda", "kda", "mla") * 6,
        ),
    ):
        comparison = memory.compare_with_counterpart(config, (t,), torch.bfloat16)
        n_mla = config.mixers.count("mla")
        n_kda = len(config.mixers) - n_mla
        assert comparison["model"]["total"] == [kimi_linear_by_hand(config, t, n_kda, n_mla)]
        counterpart = softmax_counterpart(config)
        by_hand = kimi_linear_by_hand(counterpart, t, 0, len(config.mixers))
        assert comparison["counterpart"]["total"] == [by_hand]
        reduction = comparison["reduction"][0]
        assert reduction < memory.KIMI_LINEAR_REPORT["reduction"]  # "up to"
        # the report states a whole percent: 74.99% (our preset), 74.87% (the released sizes)
        assert round(100 * reduction) == round(100 * memory.KIMI_LINEAR_REPORT["reduction"])


def test_preset_command(capsys):
    assert main(["memory", "--preset", "kimi_linear", "--contexts", "1024,1048576"]) == 0
    text = capsys.readouterr().out
    assert "Its counterpart, every block mla" in text
    assert "t = 1,048,576: the cache is 74.99% smaller than all-mla's" in text
    assert "the Kimi Linear report: up to 75% less KV cache at 1,048,576 tokens" in text
    assert main(["memory", "--preset", "qwen3_next", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counterpart"]["config"]["mixers"] == ["gated_attention"] * 8
    assert data["model"]["contexts"] == list(memory.PRESET_CONTEXTS)
    assert main(["memory", "--preset", "gated_deltanet", "--d-model", "64"]) == 2
    assert "--preset sets the model's sizes; drop --d-model" in capsys.readouterr().err
