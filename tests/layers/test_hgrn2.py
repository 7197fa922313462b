"""Our HGRN2 equals fla 0.6.0's ``HGRN2Attention`` with the same weights (fla's layer under
Triton's interpreter, float32; ours in float32 and float64), and its decoding step equals its
forward."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.hgrn2 import HGRN2
from tests.layers.pieces import check_forms_agree

B, T, D = 1, 6, 32


def test_forward_gradients_and_decoding_equal_fla():
    pytest.importorskip("tests.fla_interpreter")  # before fla
    fla_layers = pytest.importorskip("fla.layers")
    from tests.layers.reference_layers import check_from_fla, perturb, relative_error

    torch.manual_seed(0)
    module = fla_layers.HGRN2Attention(hidden_size=D, num_heads=2, expand_ratio=8, layer_idx=0)
    perturb(module)
    ours64, x, y_fla = check_from_fla(module, HGRN2, (B, T, D))
    with torch.no_grad():
        state = ours64.new_state(B, torch.float64)
        steps = []
        for t in range(T):
            y, state = ours64(x[:, t : t + 1].double(), state)
            steps.append(y)
    assert relative_error(torch.cat(steps, dim=1), y_fla.double()) < 1e-5


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(1)
    layer = HGRN2(16, 2, expand_ratio=4, chunk_size=4).double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_are_refused():
    with pytest.raises(TypeError, match="HGRN2 does not take short_conv"):
        HGRN2(16, 2, short_conv=True)
    with pytest.raises(ValueError, match=r"d_model \(16\) must be a multiple of n_heads \(3\)"):
        HGRN2(16, 3)
    with pytest.raises(TypeError, match="fla's HGRN2Attention"):
        HGRN2.from_fla(HGRN2(16, 2))
