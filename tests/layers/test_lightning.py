"""``LightningAttention``: its decays (fla's slopes), its forms, generation in pieces against one
call (float64), its states carried between calls, the options it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.compat.simple_gla import lightning_gamma
from linattn.layers import LightningAttention
from linattn.layers.lightning import lightning_log_decays
from tests.layers.pieces import check_forms_agree, check_pieces


def test_decays_are_fla_s_slopes():
    for H, layer, layers in ((4, 0, 1), (8, 3, 12), (2, 5, 6)):
        ours = lightning_log_decays(H, layer, layers, torch.float64)
        torch.testing.assert_close(ours.float(), lightning_gamma(H, layer, layers))
        assert ours[0] == 0 and math.isclose(float(ours[1]), -(8 / H) * (1 - layer / layers))


def test_equals_its_formula_token_by_token():
    torch.manual_seed(0)
    layer = LightningAttention(16, 2, layer_idx=1, num_layers=3, chunk_size=4).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x)
        q, k, v = (torch.nn.functional.silu(p(x)).view(2, 9, 2, 8)
                   for p in (layer.q_proj, layer.k_proj, layer.v_proj))  # fmt: skip
        gamma = lightning_log_decays(2, 1, 3, torch.float64).exp()
        S = torch.zeros(2, 2, 8, 8, dtype=torch.float64)
        outs = []
        for t in range(9):
            S = gamma[None, :, None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] / math.sqrt(8), S))
        o = torch.stack(outs, 1)
        flat = torch.nn.functional.rms_norm(o.flatten(-2), (16,), layer.o_norm.weight, 1e-6)
        want = layer.o_proj(flat * torch.sigmoid(layer.g_proj(x)))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)


def test_generation_in_pieces_equals_one_call_in_float64():
    torch.manual_seed(1)
    layer = LightningAttention(16, 2, layer_idx=2, num_layers=4, chunk_size=4).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])


def test_chunk_and_recurrent_forms_agree_in_float64():
    torch.manual_seed(2)
    layer = LightningAttention(16, 4, chunk_size=4).double()
    check_forms_agree(layer, torch.randn(2, 11, 16, dtype=torch.float64))


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(TypeError, match="LightningAttention does not take short_conv"):
        LightningAttention(16, 2, short_conv=True)
    with pytest.raises(ValueError, match="layer_idx must lie in"):
        LightningAttention(16, 2, layer_idx=4, num_layers=4)
    with pytest.raises(ValueError, match="num_layers must be an integer"):
        LightningAttention(16, 2, num_layers=2.0)
    with pytest.raises(ValueError, match="n_heads"):
        LightningAttention(16, 3)
    layer = LightningAttention(16, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['S'\] has shape"):
        layer(torch.randn(2, 3, 16), layer.new_state(3, torch.float32))


@pytest.mark.parametrize("layer_idx", [0, 2])
def test_equals_transformers_minimax_lightning_attention(layer_idx):
    """transformers' MiniMax-01 layer (pure PyTorch, blocks of 4 tokens) with the same weights:
    float64 (its float32 casts kept at float64), and our decoding in pieces against its forward."""
    modeling = pytest.importorskip("transformers.models.minimax.modeling_minimax")
    from transformers import MiniMaxConfig

    from tests.layers.reference_layers import perturb, promoted

    config = MiniMaxConfig(hidden_size=32, num_attention_heads=2, head_dim=8,
                           num_hidden_layers=4, block_size=4)  # fmt: skip
    torch.manual_seed(0)
    theirs = modeling.MiniMaxLightningAttention(config, layer_idx).double()
    perturb(theirs)
    # its slopes are computed in float32 when it is built: recomputed in float64 (its formula)
    h = torch.arange(1, 3, dtype=torch.float64)
    rate = (2.0 ** (-8 / 2)) ** h * (1 - layer_idx / (4 - 1 + 1e-5) + 1e-5)
    rate = rate[:, None, None]
    theirs.slope_rate = rate
    theirs.query_decay, theirs.key_decay, theirs.diagonal_decay = theirs.decay_factors(rate)
    ours = LightningAttention.from_transformers(theirs)
    assert ours.head_dim == 8 and ours.scale == 1.0 and ours.slopes == "minimax"
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    with torch.no_grad(), promoted(modeling):
        want, _ = theirs(x, None, None)
    torch.testing.assert_close(ours(x)[0], want, rtol=0, atol=1e-12)
    check_pieces(ours, x, [3, 4, 9])
    with pytest.raises(TypeError, match="MiniMaxLightningAttention"):
        LightningAttention.from_transformers(ours)


def test_minimax_slopes_are_alibi_s_scaled_by_depth():
    ours = lightning_log_decays(4, 1, 3, torch.float64, slopes="minimax")
    depth = 1 - 1 / (2 + 1e-5) + 1e-5
    want = -torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], dtype=torch.float64) * depth
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="slopes must be one of"):
        LightningAttention(16, 2, slopes="alibi")
    with pytest.raises(ValueError, match="scale must be a positive number"):
        LightningAttention(16, 2, scale=0.0)
