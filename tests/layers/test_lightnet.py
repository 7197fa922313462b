"""Our LightNet equals fla 0.6.0's ``LightNetAttention`` with the same weights (fla's layer under
Triton's interpreter, float32; ours in float32 and float64), and its decoding (the keys'
log-normaliser z carried in the state) equals its forward.

fla's gate kernel calls ``libdevice.log1p``, which triton 3.9's interpreter leaves unimplemented:
as in tests/compat/test_lightnet.py, it is computed as log(1 + x) there."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.lightnet import LightNet
from tests.layers.pieces import check_forms_agree

B, T, D = 1, 6, 32
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked lanes


def test_forward_gradients_and_decoding_equal_fla(monkeypatch):
    pytest.importorskip("tests.fla_interpreter")  # before fla
    tl = pytest.importorskip("triton.language")
    libdevice = pytest.importorskip("triton.language.extra.libdevice")
    monkeypatch.setattr(libdevice, "log1p", lambda x: tl.log(1 + x))
    fla_layers = pytest.importorskip("fla.layers")
    from tests.layers.reference_layers import check_from_fla, perturb, relative_error

    torch.manual_seed(0)
    module = fla_layers.LightNetAttention(
        hidden_size=D, num_heads=2, expand_ratio=8, gate_low_rank_dim=4, layer_idx=0
    )
    perturb(module)
    ours64, x, y_fla = check_from_fla(module, LightNet, (B, T, D))
    with torch.no_grad():
        state = ours64.new_state(B, torch.float64)
        y_prompt, state = ours64(x[:, :2].double(), state)  # a prompt, then one token at a time
        steps = [y_prompt]
        for t in range(2, T):
            y, state = ours64(x[:, t : t + 1].double(), state)
            steps.append(y)
    assert relative_error(torch.cat(steps, dim=1), y_fla.double()) < 1e-5


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(1)
    layer = LightNet(16, 2, expand_ratio=4, gate_low_rank_dim=4, chunk_size=4).double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_are_refused():
    with pytest.raises(TypeError, match="LightNet does not take short_conv"):
        LightNet(16, 2, short_conv=True)
    with pytest.raises(ValueError, match=r"d_model \(16\) must be a multiple of n_heads \(3\)"):
        LightNet(16, 3)
    with pytest.raises(TypeError, match="fla's LightNetAttention"):
        LightNet.from_fla(LightNet(16, 2))
