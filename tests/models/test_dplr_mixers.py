"""The generalized delta rule's mixers in a CausalLM (rwkv7, comba, gdn2; the per-mixer tests
of test_lm.py and test_cache.py cover each alone): RWKV-7's value residual across blocks (the
first rwkv7 block makes v_first, the later ones mix it in, another mixer between them), decoding
through the fixed state and the token shift's cached last token, the cache layouts, training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.models import CausalLM
from tests.models.test_cache import run_tokens
from tests.models.test_lm import feed, rel_error
from tests.models.tiny import make_model, tiny_config

MIXERS = ("softmax", "rwkv7", "gdn2", "rwkv7", "rwkv7")


def test_only_the_first_rwkv7_block_makes_v_first():
    model = make_model(MIXERS)
    first = [b.mixer.first_layer for b in model.blocks if b.mixer_name == "rwkv7"]
    assert first == [True, False, False]
    assert [b.mixer.v_lora is None for b in model.blocks[1::2]] == [True, False]


def test_prefill_decode_and_splits_match_the_full_forward():
    ids = torch.randint(0, 37, (2, 19), generator=torch.Generator().manual_seed(1))
    model = make_model(MIXERS, torch.float64)
    state = model.new_cache(2).blocks[1]
    assert sorted(state) == ["S", "shift"] and state["shift"].shape == (2, 32)
    with torch.no_grad():
        full = model(ids)
        for pieces in [(7,) + (1,) * 12, (1, 18), (3, 5, 1, 9, 1), (8, 8, 3)]:
            error = (feed(model, ids, pieces) - full).abs().max().item()
            assert error < 1e-10 * full.abs().max().item(), (pieces, error)
    model = model.float()
    with torch.no_grad():
        assert rel_error(feed(model, ids, (7,) + (1,) * 12), model(ids)) < 1e-4


def test_the_later_blocks_values_reach_back_to_the_first():
    """v_first carries gradient from the later blocks' outputs to the first block's v_proj."""
    model = make_model(MIXERS, torch.float32)
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(5))
    x = model.embed(ids)
    shared: dict = {}
    for block in model.blocks[:3]:
        x, _ = block(x, None, shared)
    assert shared["v_first"].shape == (2, 12, 32)
    y, _ = model.blocks[3](x.detach(), None, shared)
    y.square().sum().backward()
    assert model.blocks[1].mixer.v_proj.weight.grad.abs().max() > 0
    assert model.blocks[3].mixer.v_lora.up.weight.grad.abs().max() > 0


@pytest.mark.slow  # about 25 s here; one rwkv7 block trains in test_lm's default copy test
def test_two_rwkv7_blocks_learn_the_copy_task():
    torch.manual_seed(0)
    model = CausalLM(tiny_config(("rwkv7", "rwkv7"), vocab_size=8))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(100):
        x = torch.randint(1, 8, (16, 4), generator=generator)
        ids = torch.cat([x, torch.zeros(16, 1, dtype=torch.long), x], dim=1)
        logits = model(ids[:, :-1])[:, 4:]  # predictions of the copied half
        loss = F.cross_entropy(logits.reshape(-1, 8), ids[:, 5:].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / sum(losses[:5]) < 0.6, losses[::10]


def test_cache_layouts_are_fixed_size():
    H, D, kernel, d_model = 2, 16, 4, 32
    model = CausalLM(tiny_config(("rwkv7", "comba", "gdn2")))
    cache = model.new_cache(3)
    run_tokens(model, cache, 5)
    comba_v = 2 * D  # expand_v = 2
    assert cache.numbers_per_block() == [
        3 * (H * D * D + d_model),  # S is K x V; the token shift's last input
        3 * (H * D * comba_v + (kernel - 1) * H * (2 * D + comba_v)),
        3 * (H * D * D + (kernel - 1) * H * 3 * D),
    ]
    assert cache.nbytes_at(100_000) == cache.nbytes()
