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
from tests.layers.reference_layers import check_from_fla, perturb, relative_error  # noqa: E402

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


@pytest.mark.parametrize("name", PAIRS)
def test_forward_gradients_and_decoding_equal_fla(name):
    torch.manual_seed(0)
    module, cls = PAIRS[name]()
    perturb(module)
    ours64, x, y_fla = check_from_fla(module, cls, (B, T, D))
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
