"""Our MultiScaleRetention equals fla 0.6.0's with the same weights (fla's layer under Triton's
interpreter, float32; ours in float32 and float64), and its decoding (RoPE's offset carried in the
state) equals its forward."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.retention import MultiScaleRetention
from tests.layers.pieces import check_forms_agree

B, T, D = 1, 6, 32


@pytest.mark.parametrize("output_gate", [True, False], ids=["gate", "no_gate"])
def test_forward_gradients_and_decoding_equal_fla(output_gate):
    pytest.importorskip("tests.fla_interpreter")  # before fla
    fla_layers = pytest.importorskip("fla.layers")
    from tests.layers.reference_layers import check_from_fla, perturb, relative_error

    torch.manual_seed(0)
    module = fla_layers.MultiScaleRetention(
        hidden_size=D, num_heads=2, use_output_gate=output_gate, layer_idx=0
    )
    perturb(module)
    ours64, x, y_fla = check_from_fla(module, MultiScaleRetention, (B, T, D))
    with torch.no_grad():
        state = ours64.new_state(B, torch.float64)
        y_prompt, state = ours64(x[:, :2].double(), state)  # a prompt, then one token at a time
        steps = [y_prompt]
        for t in range(2, T):
            y, state = ours64(x[:, t : t + 1].double(), state)
            steps.append(y)
    assert int(state["position"][0]) == T
    assert relative_error(torch.cat(steps, dim=1), y_fla.double()) < 1e-5


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(1)
    layer = MultiScaleRetention(16, 2, chunk_size=4).double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_are_refused():
    with pytest.raises(TypeError, match="MultiScaleRetention does not take short_conv"):
        MultiScaleRetention(16, 2, short_conv=True)
    with pytest.raises(ValueError, match="expand_k \\* d_model / n_heads must be a positive"):
        MultiScaleRetention(16, 3)
    with pytest.raises(TypeError, match="fla's MultiScaleRetention"):
        MultiScaleRetention.from_fla(MultiScaleRetention(16, 2))
    layer = MultiScaleRetention(16, 2)
    state = layer.new_state(2, torch.float32)
    state["position"] = torch.tensor([0, 3])
    with pytest.raises(ValueError, match=r"state\['position'\] must be the same"):
        layer(torch.randn(2, 1, 16), state)
