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
