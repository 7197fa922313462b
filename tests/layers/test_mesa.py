"""linattn.layers.MesaNet: fla's layer's outputs with fla's weights, generation in pieces (fla's
decoding step and the forward's solve), the layer without its short convolutions."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import MesaNet


@pytest.mark.parametrize("gate", [False, True])
def test_equals_fla_s_layer_with_its_weights(gate):
    from linattn.integrations import fla as fla_integration

    pytest.importorskip("tests.fla_interpreter")  # before fla

    fla_layers = pytest.importorskip("fla.layers")
    fla_integration.enable()
    try:
        torch.manual_seed(0)
        theirs = fla_layers.MesaNet(hidden_size=32, num_heads=2, head_dim=16, use_output_gate=gate)
        ours = MesaNet.from_fla(theirs)
        x = torch.randn(2, 9, 32)
        torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)
    finally:
        fla_integration.disable()


def test_a_state_carries_the_sequence_across_calls():
    torch.manual_seed(1)
    # Exact solves (cg_eps = 0: textbook conjugate gradients, 30 steps for head_dim 16): with
    # fla's 1e-5 guard the solve stalls short of the solution, and where it stops moves with the
    # rounding of the state (carried across calls, or summed in one chunk), by 1e-9 or so on
    # some CPUs; the state's carrying is what this test is about.
    layer = MesaNet(32, 2, use_output_gate=True, cg_eps=0.0).double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    whole = layer(x)[0]
    layer.mode = "chunk"  # the same solve in both (the decoding step starts CG elsewhere)
    state = layer.new_state(2, torch.float64)
    parts = []
    for a, b in ((0, 4), (4, 5), (5, 11)):
        y, state = layer(x[:, a:b], state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=0, atol=1e-10)
    layer.mode = None  # a decoding step: fla's Jacobi start, near the chunk form's solve
    state = layer.new_state(2, torch.float64)
    y, state = layer(x[:, :10], state)
    y1, _ = layer(x[:, 10:], state)
    assert (y1 - whole[:, 10:]).abs().max() < 5e-2


def test_decode_as_training_decodes_with_the_forward_s_solve():
    torch.manual_seed(2)
    layer = MesaNet(32, 2, decode_as_training=True, cg_eps=0.0).double()  # exact solves (above)
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    whole = layer(x)[0]
    state = layer.new_state(2, torch.float64)
    parts = [layer(x[:, :5], state)]
    for t in range(5, 11):  # one-token steps: the recurrent mode, here with the chunk form's solve
        parts.append(layer(x[:, t : t + 1], parts[-1][1]))
    torch.testing.assert_close(torch.cat([y for y, _ in parts], 1), whole, rtol=0, atol=1e-12)


def test_without_the_short_convolution_q_and_k_go_through_silu_alone():
    torch.manual_seed(3)
    layer = MesaNet(32, 2, use_short_conv=False).double()
    assert layer.q_conv1d is None and set(layer.new_state(1, torch.float64)) == {"h_kk", "h_kv"}
    with_conv = MesaNet(32, 2).double()
    with_conv.load_state_dict(layer.state_dict(), strict=False)
    for conv in (with_conv.q_conv1d, with_conv.k_conv1d):  # the identity filter: conv(x) = silu(x)
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[:, 0, -1] = 1.0
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], with_conv(x)[0], rtol=0, atol=1e-12)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="lambda_lower_bound must be > 0"):
        MesaNet(32, 2, lambda_lower_bound=0.0)
    with pytest.raises(ValueError, match="x must have shape"):
        MesaNet(32, 2)(torch.randn(2, 3, 16))
    with pytest.raises(TypeError, match="use_short_conv"):
        MesaNet(32, 2, use_short_conv="no")
    with pytest.raises(TypeError, match="decode_as_training"):
        MesaNet(32, 2, decode_as_training="yes")
    with pytest.raises(ValueError, match="cg_eps must be a number >= 0"):
        MesaNet(32, 2, cg_eps=-1e-5)
