"""``check_pieces``: a mixer called on a sequence in pieces (a prompt, then pieces of any lengths,
its state carried) gives the outputs of one call on the whole sequence, and the same final state
as one call with a new state."""

from __future__ import annotations

import torch

from linattn.layers import TokenMixer


def check_pieces(layer: TokenMixer, x: torch.Tensor, cuts: list[int], atol: float = 1e-12):
    """``layer`` (float64) on x [B, T, d_model] whole, without a state, against the pieces
    x[:, a:b] between ``cuts`` (increasing, inside (0, T)) with the state carried; returns the
    final state of the pieces."""
    B, T, _ = x.shape
    layer.mode = None
    with torch.no_grad():
        y_full, _ = layer(x)
        y_once, state_once = layer(x, layer.new_state(B, x.dtype))
        state = layer.new_state(B, x.dtype)
        outs = []
        for a, b in zip([0, *cuts], [*cuts, T], strict=True):
            y, state = layer(x[:, a:b], state)
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), y_full, rtol=0, atol=atol)
    torch.testing.assert_close(y_once, y_full, rtol=0, atol=atol)
    assert set(state) == set(state_once)
    for name in state:
        torch.testing.assert_close(state[name], state_once[name], rtol=0, atol=atol)
    return state


def check_forms_agree(layer: TokenMixer, x: torch.Tensor, atol: float = 1e-12) -> None:
    """``layer`` (float64) on x [B, T, d_model] in its chunk form and in its recurrent form: the
    same outputs."""
    outputs = []
    for mode in ("chunk", "recurrent"):
        layer.mode = mode
        outputs.append(layer(x)[0])
    layer.mode = None
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=atol)


def check_from_fla(fla_layer: str, ours: type, d_model: int, **options) -> None:
    """fla 0.6.0's layer ``fla_layer`` (``fla.layers``; hidden_size d_model and ``options``), its
    weights perturbed off their initial values, run on the CPU under ``linattn.integrations.fla``,
    against ``ours.from_fla`` of it: as many parameters, the same outputs in float32 (1e-5)."""
    import pytest

    from linattn.integrations import fla as fla_integration

    pytest.importorskip("tests.fla_interpreter")  # before fla
    fla_layers = pytest.importorskip("fla.layers")
    from tests.layers.reference_layers import perturb

    fla_integration.enable()
    try:
        torch.manual_seed(0)
        theirs = getattr(fla_layers, fla_layer)(hidden_size=d_model, **options)
        perturb(theirs)
        converted = ours.from_fla(theirs)
        count = sum(p.numel() for p in theirs.parameters())
        assert sum(p.numel() for p in converted.parameters()) == count
        x = torch.randn(2, 9, d_model)
        torch.testing.assert_close(converted(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)
    finally:
        fla_integration.disable()
