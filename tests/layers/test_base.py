"""RecurrentMixer: the three forms of the op agree inside every layer; state layout and checks."""

from __future__ import annotations

import pytest
import torch

from linattn.models import MIXERS, LMConfig, build_mixer

RECURRENT = [m for m in MIXERS if m != "softmax"]
CONFIG = LMConfig(vocab_size=10, d_model=16, n_heads=2, chunk_size=4, taylor_dim=4)


@pytest.mark.parametrize("name", RECURRENT)
def test_chunk_recurrent_and_parallel_modes_agree(name):
    torch.manual_seed(0)
    layer = build_mixer(name, CONFIG).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    outputs = {}
    for mode in ("chunk", "recurrent", "parallel"):
        layer.mode = mode
        outputs[mode], _ = layer(x)
    for mode in ("recurrent", "parallel"):
        torch.testing.assert_close(outputs[mode], outputs["chunk"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", RECURRENT)
def test_mode_picked_from_the_call(name):
    layer = build_mixer(name, CONFIG)
    state = layer.new_state(1, torch.float32)
    assert layer.pick_mode(5, None) == "chunk"
    assert layer.pick_mode(5, state) == "chunk"  # prefill
    assert layer.pick_mode(1, state) == "recurrent"  # a decoding step
    assert layer.pick_mode(1, None) == "chunk"


def test_state_checks_name_the_tensor():
    layer = build_mixer("gated_deltanet", CONFIG)
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match=r"state must hold the tensors \['S', 'conv'\]"):
        layer(x, {"S": torch.zeros(2, 2, 8, 8)})
    state = layer.new_state(2, torch.float32)
    state["S"] = torch.zeros(2, 2, 8, 9)
    with pytest.raises(ValueError, match=r"state\['S'\] has shape \[2, 2, 8, 9\], expected"):
        layer(x, state)
    state = layer.new_state(2, torch.float64)
    with pytest.raises(ValueError, match=r"state\['S'\] has dtype torch.float64"):
        layer(x, state)
    with pytest.raises(ValueError, match=r"at least one token"):
        layer(torch.randn(2, 0, 16))
