"""``HGRN``: fla 0.6.0's ``HGRNAttention`` with the same weights (fla's layer on the CPU under
``linattn.integrations.fla``), generation in pieces against one call (float64), its forms, the
options and inputs it refuses."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import HGRN
from tests.layers.pieces import check_forms_agree, check_from_fla, check_pieces


def test_equals_fla_s_layer_with_its_weights():
    check_from_fla("HGRNAttention", HGRN, 16, expand_ratio=2, layer_idx=0)


def test_equals_its_formula_token_by_token():
    torch.manual_seed(0)
    layer = HGRN(8, expand_ratio=2, chunk_size=4).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x)
        f = torch.nn.functional.logsigmoid(layer.f_proj(x))
        i = torch.nn.functional.silu(layer.i_proj(x)) * (1 - f.exp())
        h, hs = torch.zeros(2, 16, dtype=torch.float64), []
        for t in range(7):
            h = f[:, t].exp() * h + i[:, t]
            hs.append(h)
        h = torch.stack(hs, 1)
        o = torch.nn.functional.rms_norm(h, (16,), layer.g_norm.weight, 1e-5)
        want = layer.o_proj(o * torch.nn.functional.silu(layer.g_proj(x)))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)


def test_generation_in_pieces_equals_one_call_in_float64():
    torch.manual_seed(1)
    layer = HGRN(16, expand_ratio=2, chunk_size=4).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(2)
    layer = HGRN(16, chunk_size=4).double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="expand_ratio must be an integer >= 1"):
        HGRN(16, expand_ratio=0)
    with pytest.raises(TypeError, match="fla's HGRNAttention"):
        HGRN.from_fla(HGRN(16))
    layer = HGRN(16)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['S'\] has shape"):
        layer(torch.randn(2, 3, 16), layer.new_state(3, torch.float32))
