"""``RWKV6``: fla 0.6.0's ``RWKV6Attention`` with the same weights (on the CPU under
``linattn.integrations.fla``), generation in pieces against one call (float64), its forms, what
it refuses."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import RWKV6
from tests.layers.pieces import check_forms_agree, check_from_fla, check_pieces

pytestmark = pytest.mark.filterwarnings("ignore:According to Bo")  # fla's RWKV warning


def _perturbed(layer: RWKV6) -> RWKV6:
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return layer


def test_equals_fla_s_layer_with_its_weights():
    check_from_fla("RWKV6Attention", RWKV6, 32, num_heads=2, proj_low_rank_dim=4,
                   gate_low_rank_dim=8, layer_idx=0)  # fmt: skip


def test_generation_in_pieces_equals_one_call_in_float64():
    torch.manual_seed(1)
    layer = _perturbed(RWKV6(16, 2, proj_low_rank_dim=4, gate_low_rank_dim=8, chunk_size=4))
    layer = layer.double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(2)
    layer = _perturbed(RWKV6(16, 2, proj_low_rank_dim=4, gate_low_rank_dim=8, chunk_size=4))
    layer = layer.double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="expand_k \\* d_model must be a positive multiple"):
        RWKV6(16, 3)
    with pytest.raises(ValueError, match="proj_low_rank_dim must be an integer >= 1"):
        RWKV6(16, 2, proj_low_rank_dim=0)
    with pytest.raises(TypeError, match="fla's RWKV6Attention"):
        RWKV6.from_fla(RWKV6(16, 2))
    layer = RWKV6(16, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['S'\] has shape"):
        layer(torch.randn(2, 3, 16), RWKV6(16, 4).new_state(2, torch.float32))
