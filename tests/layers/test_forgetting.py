"""``linattn.layers.forgetting.ForgettingAttention`` equals fla's ``ForgettingAttention`` with
the same weights (fla's layer on its Triton kernel under the interpreter), in both forms, with
grouped heads, a window and the output gate; packed sequences equal separate ones."""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
fla_layers = pytest.importorskip("fla.layers")

from linattn.layers.forgetting import ForgettingAttention  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_equals_fla_s_layer(mode):
    torch.manual_seed(0)
    # fla's layer keeps window_size for its cache only (its attention is not windowed)
    options = dict(hidden_size=32, num_heads=4, num_kv_heads=2, use_output_gate=True)
    theirs = fla_layers.ForgettingAttention(**options, layer_idx=0)
    ours = ForgettingAttention(**options, mode=mode, chunk_size=8)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 21, 32)
    want = theirs(x)[0]
    got = ours(x)
    assert interp.relative(got, want) < 1e-5
    got.sum().backward()
    assert ours.f_proj.weight.grad is not None


def test_packed_sequences_equal_separate_ones():
    torch.manual_seed(1)
    layer = ForgettingAttention(hidden_size=16, num_heads=2).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    packed = layer(x, cu_seqlens=torch.tensor([0, 1, 7, 12]))
    parts = torch.cat([layer(x[:, a:b]) for a, b in ((0, 1), (1, 7), (7, 12))], dim=1)
    torch.testing.assert_close(packed, parts, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="num_heads"):
        ForgettingAttention(hidden_size=16, num_heads=3, num_kv_heads=2)
