"""Our GatedDeltaNet and KimiDeltaAttention equal fla 0.6.0's layers with the same weights.

fla's layers run on the CPU under Triton's interpreter (``tests/fla_interpreter.py``, which must
be imported before fla; the test skips without it or without fla). fla's kernels take float32 (the
interpreter refuses float64), so the float64 side is ours: fla's float32 forward and gradients
against our float64 ones, and ours in float32 against the same, both to 1e-5 relative; then our
token-by-token decoding against fla's forward. The interpreter is slow: one short sequence.
"""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")  # before fla
fla_layers = pytest.importorskip("fla.layers")

from linattn.layers import GatedDeltaNet, KimiDeltaAttention  # noqa: E402
from tests.layers.reference_layers import (  # noqa: E402
    gradients_as_module,
    perturb,
    relative_error,
)

B, T, D = 1, 6, 32
PAIRS = {
    "gated_deltanet": lambda: (
        fla_layers.GatedDeltaNet(D, expand_v=2, head_dim=8, num_heads=2, num_v_heads=4),
        GatedDeltaNet,
    ),
    "kda": lambda: (
        fla_layers.KimiDeltaAttention(D, head_dim=8, num_heads=2, num_v_heads=4),
        KimiDeltaAttention,
    ),
}


def gradients(layer, x, w):
    x = x.clone().requires_grad_()
    y = layer(x)[0]
    (y * w).sum().backward()
    return y, x.grad, {n: p.grad for n, p in layer.named_parameters()}


@pytest.mark.parametrize("name", PAIRS)
def test_forward_gradients_and_decoding_equal_fla(name):
    torch.manual_seed(0)
    module, cls = PAIRS[name]()
    perturb(module)
    ours32 = cls.from_fla(module)
    assert sum(p.numel() for p in ours32.parameters()) == sum(
        p.numel() for p in module.parameters()
    )
    ours64 = cls.from_fla(module).double()
    x, w = torch.randn(2, B, T, D)
    truth = gradients(ours64, x.double(), w.double())
    y_fla, dx_fla, dw_fla = gradients(module, x, w)
    # fla's weight gradients in our layout: the converter run on a copy holding them
    grads = cls.from_fla(gradients_as_module(module))
    fla_result = (y_fla, dx_fla, dict(grads.named_parameters()))
    for result in (fla_result, gradients(ours32, x, w)):
        y, dx, dw = result
        assert relative_error(y.double(), truth[0]) < 1e-5, "forward"
        assert relative_error(dx.double(), truth[1]) < 1e-5, "input gradient"
        for n, g in truth[2].items():
            assert relative_error(dw[n].double(), g) < 1e-5, n
    with torch.no_grad():
        state = ours64.new_state(B, torch.float64)
        steps = []
        for t in range(T):
            y, state = ours64(x[:, t : t + 1].double(), state)
            steps.append(y)
    assert relative_error(torch.cat(steps, dim=1), y_fla.double()) < 1e-5


def test_from_fla_refuses_our_own_layer():
    with pytest.raises(TypeError, match="fla's GatedDeltaNet"):
        GatedDeltaNet.from_fla(GatedDeltaNet(16, 2))
