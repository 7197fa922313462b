"""The presets mamba2, gla and deltanet: their layers as the papers define them, and generation
through their caches; the "mamba2" mixer's sizes in LMConfig."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import DeltaNet, GatedLinearAttention, Mamba2
from linattn.models import CausalLM, LMConfig
from linattn.models.presets import PRESETS, preset

OURS = ("mamba2", "gla", "deltanet")
TINY = dict(d_model=32, n_heads=2, chunk_size=4)  # the layouts kept, at a test's width


def test_layouts_are_the_papers():
    mamba = CausalLM(preset("mamba2")).blocks[0]
    assert isinstance(mamba.mixer, Mamba2) and mamba.mlp is None  # Mamba-2: the mixer alone
    m = mamba.mixer
    assert (m.n_heads, m.head_dim, m.d_state, m.d_inner, m.n_groups) == (8, 64, 64, 512, 1)
    gla = CausalLM(preset("gla")).blocks[0]
    g = gla.mixer
    assert isinstance(g, GatedLinearAttention) and gla.mlp is not None
    assert (g.key_dim, g.head_dim, g.conv, g.o_norm.eps) == (32, 64, None, 1e-5)  # keys d/2
    assert g.g_proj is not None and g.decay.a_proj[0].out_features == 16
    delta = CausalLM(preset("deltanet")).blocks[0].mixer
    assert isinstance(delta, DeltaNet) and delta.g_proj is None and delta.conv is not None
    assert preset("gla", vocab_size=100, d_model=64).d_model == 64
    with pytest.raises(ValueError, match="unknown preset 'mamba'"):
        preset("mamba")


@pytest.mark.parametrize("name", OURS)
def test_prefill_then_decode_equals_one_forward(name):
    assert name in PRESETS
    torch.manual_seed(0)
    model = CausalLM(preset(name, vocab_size=37, **TINY)).double()
    ids = torch.randint(0, 37, (2, 9))
    full = model(ids)
    cache = model.new_cache(2)
    logits = [model(ids[:, :5], cache=cache)]
    for t in range(5, 9):
        logits.append(model(ids[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=0, atol=1e-12)
    out = model.generate(ids[:, :3], max_new_tokens=4, temperature=0)
    assert out.shape == (2, 7) and torch.equal(out[:, :3], ids[:, :3])


def test_mamba2_cache_holds_its_state_and_convolution():
    config = preset("mamba2", vocab_size=11, **TINY)  # 2 heads of 32, N = 64
    cache = CausalLM(config).new_cache(3)
    assert cache.blocks[0]["S"].shape == (3, 2, 64, 32)
    assert cache.blocks[0]["conv"].shape == (3, 64 + 2 * 64, 3)
    heads = LMConfig(vocab_size=11, d_model=32, head_dim=8, mixers=("mamba2",))
    assert CausalLM(heads).blocks[0].mixer.n_heads == 8  # head_dim given: fla's inferred heads


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=30, n_heads=4, head_dim=None), "divisible by n_heads"),
        (dict(d_model=32, n_heads=2, head_dim=12), "divisible by head_dim"),
        (dict(d_model=32, n_heads=2, n_groups=3), "not divisible by n_groups"),
        (dict(d_model=32, n_heads=2, state_size=0), "state_size"),
    ],
)
def test_mamba2_sizes_are_checked_when_the_config_is_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LMConfig(vocab_size=11, mixers=("mamba2",), **kwargs)
