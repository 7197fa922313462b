"""RecurrentMixer: the three forms of the op agree inside every layer; state layout and checks."""

from __future__ import annotations

import pytest
import torch

from linattn.models import ATTENTION_MIXERS, MIXERS, LMConfig, build_mixer
from linattn.ops.tuning import DECODE_TOKENS

RECURRENT = [m for m in MIXERS if m not in ATTENTION_MIXERS]
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
    assert layer.pick_mode(DECODE_TOKENS + 1, state) == "chunk"  # prefill
    assert layer.pick_mode(1, state) == "recurrent"  # a decoding step
    # A few tokens with a state (speculative decoding): the fused step token by token
    assert layer.pick_mode(DECODE_TOKENS, state) == "recurrent"
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


@pytest.mark.parametrize("name", ["deltanet", "kda", "linear"])
def test_without_output_gate_the_output_is_the_normed_read(name):
    gated = build_mixer(name, LMConfig(**dict(CONFIG.to_dict(), output_gate=True)))
    plain = build_mixer(name, LMConfig(**dict(CONFIG.to_dict(), output_gate=False))).double()
    assert plain.g_proj is None
    n_gate = sum(p.numel() for p in gated.g_proj.parameters())
    count = sum(p.numel() for p in plain.parameters())
    assert count == sum(p.numel() for p in gated.parameters()) - n_gate
    torch.manual_seed(3)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    seen = {}
    run = plain.recurrence

    def recurrence(*args, **kwargs):  # the op's output, before the norm
        seen["o"], S = run(*args, **kwargs)
        return seen["o"], S

    plain.recurrence = recurrence
    y, _ = plain(x)
    o = seen["o"]  # [B, T, H, V]
    normed = torch.nn.functional.rms_norm(o, (8,), plain.o_norm.weight, plain.o_norm.eps)
    torch.testing.assert_close(y, plain.o_proj(normed.reshape(2, 9, 16)), rtol=0, atol=1e-14)
    for mode in ("recurrent", "parallel"):
        plain.mode = mode
        torch.testing.assert_close(plain(x)[0], y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", [*MIXERS, "conv"])
@pytest.mark.parametrize("with_state", [False, True])
def test_an_empty_batch_gives_empty_outputs_states_and_gradients(name, with_state):
    # B = 0 failed inside the ops (aminmax of an empty gate).
    layer = build_mixer(name, CONFIG)
    x = torch.randn(0, 5, 16, requires_grad=True)
    state = layer.new_state(0, torch.float32) if with_state else None
    y, new_state = layer(x, state)
    assert y.shape == (0, 5, 16)
    if with_state:
        layer.check_state(new_state, 0, torch.float32)  # every state tensor of batch size 0
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize(
    ("layer", "name"),
    [
        ("GatedDeltaNet", "short_conv"),
        ("GatedDeltaNet", "output_gate"),
        ("DeltaNet", "allow_neg_eigval"),
        ("LinearAttention", "normalize"),
        ("SoftmaxAttention", "rope"),
        ("SoftmaxAttention", "short_conv"),
    ],
)
def test_yes_no_options_must_be_bools(layer, name):
    import linattn.layers

    with pytest.raises(TypeError, match=f"{name} must be a bool, got str 'no'"):
        getattr(linattn.layers, layer)(d_model=8, n_heads=2, **{name: "no"})
