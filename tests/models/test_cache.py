"""The generation cache: fixed size for recurrent blocks, growth only by the KV cache, accounting,
save / load."""

from __future__ import annotations

import pytest
import torch

from linattn.models import MIXERS, Cache, CausalLM
from tests.models.tiny import HYBRID, tiny_config

RECURRENT = tuple(m for m in MIXERS if m != "softmax")


def run_tokens(model: CausalLM, cache: Cache, n: int, piece: int = 2000) -> None:
    ids = torch.randint(0, 37, (cache.batch_size, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for start in range(0, n, piece):
            model(ids[:, start : start + piece], cache=cache)


def test_recurrent_cache_has_the_same_size_at_10_and_10000_tokens():
    model = CausalLM(tiny_config(RECURRENT, max_seq_len=None, chunk_size=64))
    cache = model.new_cache(1)
    empty = cache.nbytes()
    run_tokens(model, cache, 10)
    at_10 = cache.nbytes()
    run_tokens(model, cache, 9990)
    assert cache.position == 10_000
    assert cache.nbytes() == at_10 == empty
    assert cache.nbytes_at(10) == cache.nbytes_at(10_000) == at_10


def test_hybrid_cache_grows_only_by_the_softmax_kv_cache():
    model = CausalLM(tiny_config(HYBRID, max_seq_len=None))
    cache = model.new_cache(1)
    run_tokens(model, cache, 10)
    blocks_10 = cache.nbytes_per_block()
    run_tokens(model, cache, 990)
    blocks_1000 = cache.nbytes_per_block()
    assert blocks_1000[:3] == blocks_10[:3]  # the KDA blocks
    # One softmax block: keys and values, 2 heads of 16 float32 numbers, per token.
    assert blocks_1000[3] - blocks_10[3] == 990 * 2 * 2 * 16 * 4
    assert cache.nbytes_per_block_at(10) == blocks_10
    assert cache.nbytes_at(1000) == cache.nbytes()


def test_numbers_per_block_match_the_layouts():
    H, D, kernel = 2, 16, 4
    model = CausalLM(tiny_config(("deltanet", "linear", "taylor", "softmax")))
    cache = model.new_cache(3)
    run_tokens(model, cache, 5)
    conv = (kernel - 1) * H * (2 * D + D)  # last 3 inputs of q, k and v
    taylor_conv = (kernel - 1) * H * (2 * 4 + D)  # taylor_dim = 4 in the tiny config
    taylor_features = 1 + 4 + 16
    assert cache.numbers_per_block() == [
        3 * (H * D * D + conv),  # delta rule: S is K x V
        3 * (H * D * (D + 1) + conv),  # normalised: one more column, z
        3 * (H * taylor_features * (D + 1) + taylor_conv),
        3 * 2 * 5 * H * D,  # softmax after 5 tokens: keys and values
    ]


def test_softmax_short_conv_adds_a_fixed_conv_state():
    H, D, kernel = 2, 16, 4
    model = CausalLM(tiny_config(("softmax",), softmax_short_conv=True, max_seq_len=None))
    cache = model.new_cache(1)
    run_tokens(model, cache, 5)
    conv = (kernel - 1) * 3 * H * D  # last 3 inputs of q, k and v
    assert cache.numbers_per_block() == [2 * 5 * H * D + conv]
    run_tokens(model, cache, 7)
    assert cache.numbers_per_block() == [2 * 12 * H * D + conv]


def test_gated_convolution_block_keeps_its_last_inputs():
    model = CausalLM(tiny_config(("conv", "deltanet"), gated_conv_size=3))
    cache = model.new_cache(2)
    run_tokens(model, cache, 5)
    H, D, kernel = 2, 16, 4
    assert cache.numbers_per_block() == [
        2 * (3 - 1) * 32,  # the last 2 inputs of d_model = 32 channels
        2 * (H * D * D + (kernel - 1) * H * 3 * D),
    ]


def test_save_and_load_round_trip_exactly(tmp_path):
    model = CausalLM(tiny_config(HYBRID)).double()
    cache = model.new_cache(2)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids, cache=cache)
    cache.save(tmp_path / "c.pt")
    loaded = Cache.load(tmp_path / "c.pt")
    assert (loaded.position, loaded.batch_size, loaded.fingerprint) == (9, 2, cache.fingerprint)
    assert loaded.growing == cache.growing
    for a, b in zip(cache.blocks, loaded.blocks, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name])
    step = torch.randint(0, 37, (2, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(step, cache=cache), model(step, cache=loaded))


def test_load_refuses_other_files(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "w.pt")
    with pytest.raises(ValueError, match="not a linattn cache"):
        Cache.load(tmp_path / "w.pt")


def test_nbytes_at_rejects_negative_t():
    cache = CausalLM(tiny_config(("softmax",))).new_cache(1)
    with pytest.raises(ValueError, match="t must be"):
        cache.nbytes_at(-1)
