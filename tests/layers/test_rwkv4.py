"""``RWKV4``: RWKV-4's time mixing written out (token shift, WKV with its bonus, receptance),
generation in pieces against one call (float64), its forms, what it refuses."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import RWKV4
from linattn.layers.rwkv4 import EMPTY_EPS
from tests.layers.pieces import check_forms_agree, check_pieces


def _layer(seed: int, C: int = 16, chunk_size: int = 4) -> RWKV4:
    torch.manual_seed(seed)
    layer = RWKV4(C, chunk_size=chunk_size).double()
    with torch.no_grad():
        for p in (layer.time_decay, layer.time_first, layer.time_mix_k, layer.time_mix_v):
            p.add_(0.3 * torch.randn_like(p))
    return layer


def test_equals_its_formula_token_by_token():
    layer = _layer(0, C=8)
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x)
        prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)

        def mixed(mu):
            return x * mu + prev * (1 - mu)

        k, v = layer.key(mixed(layer.time_mix_k)), layer.value(mixed(layer.time_mix_v))
        r = layer.receptance(mixed(layer.time_mix_r))
        w, u = layer.time_decay.exp(), layer.time_first
        outs = []
        for t in range(9):
            past = torch.arange(t, dtype=torch.float64)
            weights = torch.exp(-(t - 1 - past)[None, :, None] * w + k[:, :t])  # [B, t, C]
            bonus = torch.exp(u + k[:, t])
            num = (weights * v[:, :t]).sum(1) + bonus * v[:, t]
            outs.append(num / (weights.sum(1) + bonus))
        want = layer.output(torch.sigmoid(r) * torch.stack(outs, 1))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)


def test_generation_in_pieces_equals_one_call_in_float64():
    layer = _layer(1)
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])
    assert (layer.new_state(2, torch.float64)["wkv"][:, 2] == EMPTY_EPS).all()


def test_chunk_and_recurrent_forms_agree_in_float64():
    layer = _layer(2)
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="d_model must be an integer >= 1"):
        RWKV4(0)
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        RWKV4(16, chunk_size=0)
    layer = RWKV4(16)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    state = layer.new_state(2, torch.float32)
    with pytest.raises(ValueError, match=r"state\['shift'\] has dtype"):
        layer(torch.randn(2, 3, 16), {**state, "shift": state["shift"].double()})


@pytest.mark.parametrize("attention_size", [None, 24])
def test_equals_transformers_rwkv_self_attention(attention_size):
    """transformers' RWKV-4 time mixing (its pure-PyTorch WKV loop) with the same weights:
    float64 (its float32 casts kept at float64), whole and with its state carried in pieces."""
    modeling = pytest.importorskip("transformers.models.rwkv.modeling_rwkv")
    from transformers import RwkvConfig

    from tests.layers.reference_layers import perturb, promoted

    config = RwkvConfig(hidden_size=16, attention_hidden_size=attention_size, num_hidden_layers=1)
    torch.manual_seed(0)
    theirs = modeling.RwkvSelfAttention(config).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    perturb(theirs)
    ours = RWKV4.from_transformers(theirs)
    assert ours.attention_size == (attention_size or 16)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad(), promoted(modeling):
        want, _ = theirs(x)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], want, rtol=0, atol=1e-12)
    check_pieces(ours, x, [4, 5, 7])
    with pytest.raises(TypeError, match="RwkvSelfAttention"):
        RWKV4.from_transformers(ours)
