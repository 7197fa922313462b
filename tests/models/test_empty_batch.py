"""CausalLM on an empty batch (B = 0): what PyTorch's own modules do."""

from __future__ import annotations

import pytest
import torch

from tests.models.tiny import CASES, IDS, make_model


@pytest.mark.parametrize("mixers", CASES, ids=IDS)
def test_an_empty_batch_gives_empty_logits_gradients_and_generation(mixers):
    # B = 0 was refused here and failed inside the ops (aminmax of nothing).
    model = make_model(mixers, torch.float32)
    ids = torch.zeros(0, 5, dtype=torch.long)
    logits = model(ids)
    assert logits.shape == (0, 5, model.config.vocab_size)
    logits.sum().backward()
    for name, p in model.named_parameters():  # as nn.Linear on an empty batch: zero gradients
        assert p.grad is not None and not p.grad.any(), name
    cache = model.new_cache(0)
    assert model(ids, cache=cache).shape == (0, 5, model.config.vocab_size)
    assert cache.position == 5
    assert model.generate(ids, 3, seed=0).shape == (0, 8)
