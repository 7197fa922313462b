"""linattn.layers.PrecondGatedDeltaNet and PrecondKDA: with fla's weights
(``from_fla``) each computes fla's layer (run on the CPU through ``linattn.integrations.fla``),
and their two states (the memory and the preconditioner) carry a prefill into token-by-token
decoding exactly."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.precond import PrecondGatedDeltaNet, PrecondKDA

D = 32


@pytest.mark.parametrize("cls,A_heads", [(PrecondGatedDeltaNet, 2), (PrecondKDA, 4)])
def test_decoding_with_both_states_equals_the_whole_sequence(cls, A_heads):
    torch.manual_seed(0)
    layer = cls(D, 2, 16, num_v_heads=4).double()
    x = torch.randn(2, 11, D, dtype=torch.float64)
    y, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert set(state) == {"S", "A", "conv"} and state["A"].shape == (2, A_heads, 16)
    ys = []
    y0, state = layer(x[:, :6], state)
    ys.append(y0)
    for t in range(6, 11):
        y_t, state = layer(x[:, t : t + 1], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y, rtol=0, atol=1e-12)
    assert float(state["A"].min()) >= 0


def test_equals_flas_layer_with_its_weights():
    pytest.importorskip("tests.fla_interpreter")
    fla_layers = pytest.importorskip("fla.layers")
    from linattn.integrations import fla as linattn_fla

    torch.manual_seed(0)
    theirs = fla_layers.PrecondGatedDeltaNet(hidden_size=D, head_dim=16, num_heads=2, layer_idx=0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = PrecondGatedDeltaNet.from_fla(theirs)
    x = torch.randn(2, 20, D)
    linattn_fla.enable()
    try:
        want = theirs(x)[0]
    finally:
        linattn_fla.disable()
    got = ours(x)[0]
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_kda_equals_flas_layer_with_its_weights(monkeypatch):
    """fla's layer calls its KDA gate kernel (``fused_kda_gate``, Triton only); here it is
    stood in for by its formula, ``linattn.compat.kda_gate``."""
    pytest.importorskip("tests.fla_interpreter")
    fla_layers = pytest.importorskip("fla.layers")
    from fla.layers import precond_kda as fla_module

    from linattn.compat import kda_gate
    from linattn.integrations import fla as linattn_fla

    def gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
        return kda_gate(g, A_log, dt_bias, lower_bound).to(output_dtype)

    monkeypatch.setattr(fla_module, "fused_kda_gate", gate)
    torch.manual_seed(0)
    theirs = fla_layers.PrecondKDA(
        hidden_size=D, head_dim=16, num_heads=2, num_v_heads=4, layer_idx=0
    )
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = PrecondKDA.from_fla(theirs)
    x = torch.randn(2, 20, D)
    linattn_fla.enable()
    try:
        want = theirs(x)[0]
    finally:
        linattn_fla.disable()
    got = ours(x)[0]
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="squash_x must be a number > 0"):
        PrecondGatedDeltaNet(D, 2, 16, squash_x=0)
