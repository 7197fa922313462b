"""Short convolution, gated RMSNorm, decay gates and the state checks of ``TokenMixer``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.layers.mixer import state_dtype
from linattn.layers.modules import DecayGate, GatedRMSNorm, ShortConvolution


def test_short_convolution_is_the_causal_formula():
    torch.manual_seed(0)
    conv = ShortConvolution(3, kernel_size=4).double()
    x = torch.randn(2, 7, 3, dtype=torch.float64)
    y, state = conv(x)
    w = conv.weight[:, 0, :]  # [C, kernel]
    expected = torch.zeros_like(x)
    for t in range(7):
        for i in range(4):
            s = t - 3 + i
            if s >= 0:
                expected[:, t] += w[:, i] * x[:, s]
    torch.testing.assert_close(y, F.silu(expected), rtol=0, atol=1e-14)
    # The state is the last kernel - 1 inputs, channels first.
    torch.testing.assert_close(state, x[:, -3:].transpose(1, 2))
    assert conv.state_shape(2) == state.shape == (2, 3, 3)


@pytest.mark.parametrize("pieces", [(1, 1, 1, 1, 1, 1, 1, 1, 1), (2, 5, 1, 1), (4, 5), (9,)])
def test_short_convolution_in_pieces_matches_one_call(pieces):
    torch.manual_seed(1)
    conv = ShortConvolution(5).double()
    x = torch.randn(3, sum(pieces), 5, dtype=torch.float64)
    whole, whole_state = conv(x)
    outs, state, start = [], None, 0
    for n in pieces:
        y, state = conv(x[:, start : start + n], state)
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(state, whole_state)


def test_gated_rmsnorm():
    torch.manual_seed(2)
    norm = GatedRMSNorm(4, "sigmoid").double()
    o = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    gate = torch.randn_like(o)
    rms = o.pow(2).mean(-1, keepdim=True).add(norm.eps).sqrt()
    torch.testing.assert_close(norm(o, gate), o / rms * torch.sigmoid(gate))
    with pytest.raises(ValueError, match="activation"):
        GatedRMSNorm(4, "relu")


def test_decay_gates_shapes_ranges_and_initialisation():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 16)
    scalar = DecayGate(16, 2, 8, "scalar")
    channel = DecayGate(16, 2, 8, "channel", rank=4)
    gla = DecayGate(16, 2, 8, "gla", rank=4)
    assert scalar(x).shape == (2, 5, 2)
    assert channel(x).shape == gla(x).shape == (2, 5, 2, 8)
    for gate in (scalar, channel, gla):
        assert (gate(x) <= 0).all()
    # Mamba-2 initialisation: A in [1, 16], softplus(dt_bias) = dt in [0.001, 0.1].
    for gate in (scalar, channel):
        A = gate.A_log.exp()
        assert ((A >= 1) & (A <= 16)).all()
        dt = F.softplus(gate.dt_bias)
        assert ((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5))).all()
    # GLA: g = logsigmoid(a) / 16, so a = 0 gives the decay alpha = sigmoid(0)^(1/16) = 0.5^(1/16).
    torch.nn.init.zeros_(gla.a_proj[1].weight)
    torch.nn.init.zeros_(gla.a_proj[1].bias)
    torch.testing.assert_close(gla(x).exp(), torch.full((2, 5, 2, 8), 0.5 ** (1 / 16)))
    with pytest.raises(ValueError, match="kind"):
        DecayGate(16, 2, 8, "vector")


def test_decay_gate_draws_its_step_sizes_in_dt_range():
    torch.manual_seed(0)
    for kind in ("scalar", "channel"):
        dt = F.softplus(DecayGate(16, 2, 8, kind, rank=4, dt_range=(1e-4, 1e-2)).dt_bias)
        assert ((dt >= 1e-4 * (1 - 1e-5)) & (dt <= 1e-2 * (1 + 1e-5))).all()
    for bad in ((0.0, 1e-2), (1e-2, 1e-3), (1e-3,), "wide", (1e-3, float("inf"))):
        with pytest.raises(ValueError, match="dt_range must be a pair"):
            DecayGate(16, 2, 8, "scalar", dt_range=bad)


def test_state_dtype():
    assert state_dtype(torch.float64) == torch.float64
    assert state_dtype(torch.bfloat16) == torch.float32
    assert state_dtype(torch.float32) == torch.float32
