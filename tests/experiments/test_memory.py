"""linattn memory: cache bytes per block from the cache's own layout."""

from __future__ import annotations

import json

import pytest
import torch

from linattn import cli
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
