"""FoX's forget-gate initialisation (``dt_init_range``): the bias gives head h the initial gate
exp(-dt_h), dt_h spread geometrically over the range; it survives ``CausalLM``'s initialisation
and is set through ``LMConfig.dt_init_range``; without it the bias is zero (fla's)."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.layers.forgetting import ForgettingAttention, ForgettingAttentionMixer, forget_bias
from linattn.models import CausalLM, LMConfig


def test_the_bias_gives_each_head_its_decay_time():
    bias = forget_bias(4, (1 / 256, 1 / 32))
    gate = torch.sigmoid(bias)
    dt = torch.tensor([1 / 256, 1 / 128, 1 / 64, 1 / 32], dtype=torch.float64)
    torch.testing.assert_close(gate, torch.exp(-dt), rtol=1e-14, atol=0)
    assert bias[0].item() == pytest.approx(-math.log(math.expm1(1 / 256)), rel=1e-14)
    torch.testing.assert_close(forget_bias(1, (1e-4, 1e-2)), -torch.log(torch.expm1(
        torch.tensor([1e-3], dtype=torch.float64))))  # fmt: skip


@pytest.mark.parametrize("layer", [ForgettingAttention, ForgettingAttentionMixer])
def test_the_layers_start_their_gates_there(layer):
    args = (16, 2)  # width, heads
    plain = layer(*args)
    assert plain.dt_init_range is None
    set_ = layer(*args, dt_init_range=(1e-3, 1e-1))
    torch.testing.assert_close(set_.f_proj.bias, forget_bias(2, (1e-3, 1e-1)).float())
    # at x = 0 the mixer's log gate is log(exp(-dt)) = -dt
    x = torch.zeros(1, 3, 16)
    log_f = torch.nn.functional.logsigmoid(set_.f_proj(x))
    torch.testing.assert_close(log_f[0, 0], torch.tensor([-1e-3, -1e-1]), rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="dt_init_range must be a pair"):
        layer(*args, dt_init_range=(0.1, 0.01))


def test_the_model_keeps_the_bias_its_config_sets():
    config = LMConfig(vocab_size=11, d_model=16, n_heads=2, mixers=("forgetting",),
                      dt_init_range=(1e-4, 1e-2))  # fmt: skip
    model = CausalLM(config)
    bias = model.blocks[0].mixer.f_proj.bias
    torch.testing.assert_close(bias, forget_bias(2, (1e-4, 1e-2)).float())
    plain = CausalLM(LMConfig(vocab_size=11, d_model=16, n_heads=2, mixers=("forgetting",)))
    assert bool((plain.blocks[0].mixer.f_proj.bias == 0).all())  # the zero bias, fla's
    tokens = torch.randint(0, 11, (1, 5))
    model(tokens).sum().backward()
    assert bias.grad is not None
