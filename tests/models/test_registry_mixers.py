"""The ``LMConfig.mixers`` that ``build_mixer`` takes from the registry (log-linear Gated DeltaNet,
MesaNet, PaTH, FoX, lightning attention, HGRN, Based, ReBased, RWKV-4, RWKV-6, stick-breaking,
IPLR, DPLR): built by their layers' ``from_config`` with no builder of their own, the config's
options reaching the layers, FoX's cached mixer against its training layer, and their caches
(fixed for log-linear Gated DeltaNet and MesaNet, a KV cache for PaTH and FoX). ``test_lm.py``
runs each in a ``CausalLM`` (prefill and decoding against the full forward, splits, gradients,
training)."""

from __future__ import annotations

import pytest
import torch

from linattn import registry
from linattn.layers import (
    DPLR,
    HGRN,
    IPLR,
    RWKV4,
    RWKV6,
    Based,
    ForgettingAttentionMixer,
    LightningAttention,
    LogLinearGatedDeltaNet,
    MesaNet,
    PaTHAttention,
    ReBased,
    StickBreakingAttention,
)
from linattn.layers.forgetting import ForgettingAttention
from linattn.models import CausalLM, LMConfig, build_mixer
from linattn.models.mixers import _BUILDERS
from tests.models.test_cache import run_tokens
from tests.models.tiny import REGISTERED, tiny_config

LAYERS = {
    "log_linear_gated_deltanet": LogLinearGatedDeltaNet,
    "mesa": MesaNet,
    "path": PaTHAttention,
    "forgetting": ForgettingAttentionMixer,
    "lightning": LightningAttention,
    "hgrn": HGRN,
    "based": Based,
    "rebased": ReBased,
    "rwkv4": RWKV4,
    "rwkv6": RWKV6,
    "iplr": IPLR,
    "dplr": DPLR,
    "stickbreaking": StickBreakingAttention,
}


def test_the_registry_s_mixers_come_from_the_registry():
    assert set(REGISTERED) == set(LAYERS)
    for name, cls in LAYERS.items():
        assert name not in _BUILDERS
        entry = registry.with_mixer(name)
        assert entry is not None and hasattr(entry.layer, "from_config")
        assert type(build_mixer(name, tiny_config((name,)))) is cls
    mechanisms = {registry.with_mixer(n).name for n in LAYERS}
    assert mechanisms == {
        "log_linear_gated_delta", "mesa", "path", "forgetting", "lightning", "hgrn", "based",
        "rebased", "rwkv4", "rwkv6", "stickbreaking", "iplr", "dplr",
    }  # fmt: skip


def test_the_config_s_options_reach_the_layers():
    c = tiny_config(("mesa",), short_conv=False, output_gate=True, head_dim=8)
    mesa = build_mixer("mesa", c)
    assert mesa.q_conv1d is None and mesa.g_proj is not None and mesa.head_dim == 8
    assert mesa.decode_as_training and mesa.chunk_size == 8
    path = build_mixer("path", tiny_config(("path",), short_conv=False, num_key_value_heads=1))
    assert path.w_conv1d is None and path.num_kv_heads == 1
    assert build_mixer("path", tiny_config(("path",))).w_conv1d.kernel_size == 4  # conv_size
    fox = build_mixer("forgetting", tiny_config(("forgetting",), output_gate=True,
                                                num_key_value_heads=1))  # fmt: skip
    assert fox.g_proj is not None and fox.num_kv_heads == 1 and fox.chunk_size == 8
    assert build_mixer("forgetting", tiny_config(("forgetting",))).g_proj is None
    gdn = build_mixer("log_linear_gated_deltanet",
                      tiny_config(("gated_deltanet",), allow_neg_eigval=True,
                                  dt_init_range=(1e-4, 1e-2), expand_v=1.0))  # fmt: skip
    assert gdn.allow_neg_eigval and gdn.head_dim == gdn.key_dim == 16


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="head_dim .* for the path mixer"):
        CausalLM(tiny_config(("path",), head_dim=8))
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        CausalLM(tiny_config(("log_linear_gated_deltanet",), chunk_size=12))
    with pytest.raises(ValueError, match="unknown mixer"):
        LMConfig(vocab_size=8, mixers=("log_linear_gdn",))


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
@pytest.mark.parametrize("options", [{}, {"num_kv_heads": 1, "use_output_gate": True}])
def test_fox_s_cached_mixer_equals_its_training_layer(mode, options):
    torch.manual_seed(0)
    layer = ForgettingAttention(32, 2, **options, mode=mode, chunk_size=8).double()
    mixer = ForgettingAttentionMixer(32, 2, **options, chunk_size=8).double()
    mixer.load_state_dict(layer.state_dict())
    mixer.mode = mode if mode == "parallel" else None
    x = torch.randn(2, 21, 32, dtype=torch.float64)
    want = layer(x)
    torch.testing.assert_close(mixer(x)[0], want, rtol=0, atol=1e-12)
    state, parts = mixer.new_state(2, torch.float64), []
    for a, b in ((0, 5), (5, 6), (6, 15), (15, 21)):
        y, state = mixer(x[:, a:b], state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), want, rtol=0, atol=1e-12)
    assert state["k"].shape == (2, 21, mixer.num_kv_heads, 16) and state["G"].shape == (2, 21, 2)


@pytest.mark.parametrize("name", ["log_linear_gated_deltanet", "mesa"])
def test_fixed_state_mixers_keep_one_size(name):
    model = CausalLM(tiny_config((name,), max_seq_len=None, chunk_size=16))
    cache = model.new_cache(1)
    empty = cache.nbytes()
    run_tokens(model, cache, 10)
    at_10 = cache.nbytes()
    run_tokens(model, cache, 1990, piece=500)
    assert cache.position == 2000 and cache.nbytes() == at_10 == empty


@pytest.mark.parametrize("name", ["path", "forgetting"])
def test_kv_cache_mixers_grow_by_their_keys_values_and_gate_sums(name):
    H, D = 2, 16
    model = CausalLM(tiny_config((name,), max_seq_len=None))
    cache = model.new_cache(1)
    run_tokens(model, cache, 5)
    fixed = (4 - 1) * H * D if name == "path" else 0  # PaTH's short convolution of w
    per_token = 2 * H * D + H  # keys, values and one running gate sum per head
    assert cache.numbers_per_block() == [5 * per_token + fixed]
    run_tokens(model, cache, 7)
    assert cache.numbers_per_block() == [12 * per_token + fixed]
