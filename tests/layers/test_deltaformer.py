"""linattn.layers.DeltaFormer: fla's DeltaFormerAttention's outputs with its weights, and
generation from the (k, u) cache."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import DeltaFormer


@pytest.fixture
def fla_rotary_reference(monkeypatch):
    """fla's rotary embedding is a Triton kernel (ported to the CPU by another part of linattn);
    here fla's own torch reference, ``rotary_embedding_ref``, stands in for it."""
    pytest.importorskip("tests.fla_interpreter")  # before fla
    ops = pytest.importorskip("fla.modules.rotary.ops")

    def reference(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                  cu_seqlens=None, chunk_indices=None):  # fmt: skip
        T = x.shape[1]
        return ops.rotary_embedding_ref(
            x, cos[seqlen_offsets : seqlen_offsets + T], sin[seqlen_offsets : seqlen_offsets + T],
            interleaved,
        )  # fmt: skip

    monkeypatch.setattr(ops, "rotary_embedding", reference)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_equals_fla_s_layer_with_its_weights(fla_rotary_reference, qk_norm):
    from linattn.integrations import fla as fla_integration

    pytest.importorskip("tests.fla_interpreter")  # before fla

    fla_layers = pytest.importorskip("fla.layers")
    fla_integration.enable()
    try:
        torch.manual_seed(0)
        theirs = fla_layers.DeltaFormerAttention(hidden_size=32, num_heads=2, qk_norm=qk_norm)
        ours = DeltaFormer(32, 2, qk_norm=qk_norm)
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(2, 9, 32)
        torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)
    finally:
        fla_integration.disable()


def test_the_cache_continues_the_sequence():
    torch.manual_seed(1)
    layer = DeltaFormer(32, 2).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    whole = layer(x)[0]
    state = layer.new_state(2, torch.float64)
    parts = []
    for a, b in ((0, 4), (4, 5), (5, 10)):
        y, state = layer(x[:, a:b], state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=0, atol=1e-12)
    assert state["k"].shape == (2, 10, 2, 16)


def test_unequal_kv_heads_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads must equal n_heads"):
        DeltaFormer(32, 2, num_kv_heads=1)
