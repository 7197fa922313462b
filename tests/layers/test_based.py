"""``Based`` and ``ReBased``: fla 0.6.0's ``BasedLinearAttention`` / ``ReBasedLinearAttention``
with the same weights (fla's layers on the CPU under ``linattn.integrations.fla``), their kernels
written out, generation in pieces against one call (float64), the forms, what they refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.layers import Based, ReBased
from tests.layers.pieces import check_pieces


@pytest.mark.parametrize("name", ["based", "rebased"])
def test_equals_fla_s_layer_with_its_weights(name):
    from linattn.integrations import fla as fla_integration

    pytest.importorskip("tests.fla_interpreter")  # before fla

    fla_layers = pytest.importorskip("fla.layers")
    from tests.layers.reference_layers import perturb

    fla_integration.enable()
    try:
        torch.manual_seed(0)
        if name == "based":
            theirs = fla_layers.BasedLinearAttention(32, feature_dim=4, num_key_value_heads=2,
                                                     num_heads=2)  # fmt: skip
            ours = Based.from_fla(theirs)
        else:
            theirs = fla_layers.ReBasedLinearAttention(32, feature_dim=4, num_key_value_heads=2,
                                                       num_heads=2)  # fmt: skip
            perturb(theirs)  # gamma, beta off their ones and zeros
            ours = ReBased.from_fla(theirs)
        assert sum(p.numel() for p in ours.parameters()) == sum(
            p.numel() for p in theirs.parameters()
        )
        x = torch.randn(2, 9, 32)
        torch.testing.assert_close(ours(x)[0], theirs(x), rtol=1e-5, atol=1e-5)
    finally:
        fla_integration.disable()


def _written_out(layer, x):
    """The module docstring's sums, query by query."""
    B, T, _ = x.shape
    H, Fd, V = layer.n_heads, layer.feature_dim, layer.head_dim
    q, k = layer.q_proj(x).view(B, T, H, Fd), layer.k_proj(x).view(B, T, H, Fd)
    if isinstance(layer, ReBased):
        q = F.layer_norm(q, (Fd,), layer.gamma, layer.beta, 1e-5)
        k = F.layer_norm(k, (Fd,), layer.gamma, layer.beta, 1e-5)
    v = layer.v_proj(x).view(B, T, H, V)
    a = torch.einsum("bthf,bshf->bhts", q, k) / Fd**0.5
    f = 1 + a + a**2 / 2 if isinstance(layer, Based) else a**2
    f = f.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
    o = torch.einsum("bhts,bshv->bthv", f, v) / (f.sum(-1).transpose(1, 2)[..., None] + layer.eps)
    return layer.o_proj(o.reshape(B, T, H * V))


@pytest.mark.parametrize("cls", [Based, ReBased])
def test_equals_its_formula(cls):
    torch.manual_seed(0)
    layer = cls(16, 2, feature_dim=4, chunk_size=4).double()
    if cls is ReBased:
        with torch.no_grad():
            layer.gamma.add_(0.3 * torch.randn(4, dtype=torch.float64))
            layer.beta.add_(0.3 * torch.randn(4, dtype=torch.float64))
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        want = _written_out(layer, x)
        for mode in ("chunk", "recurrent", "parallel"):
            layer.mode = mode
            torch.testing.assert_close(layer(x)[0], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [Based, ReBased])
def test_generation_in_pieces_equals_one_call_in_float64(cls):
    torch.manual_seed(1)
    layer = cls(16, 2, feature_dim=4, chunk_size=4).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="feature_dim must be an integer >= 1"):
        Based(16, 2, feature_dim=0)
    with pytest.raises(ValueError, match="eps must be a real number >= 0"):
        ReBased(16, 2, eps=-1.0)
    with pytest.raises(ValueError, match="n_heads"):
        Based(16, 3)
    with pytest.raises(TypeError, match="fla's BasedLinearAttention"):
        Based.from_fla(ReBased(16, 2))
    with pytest.raises(TypeError, match="fla's ReBasedLinearAttention"):
        ReBased.from_fla(Based(16, 2))
    layer = ReBased(16, 2, feature_dim=4)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['S'\] has shape"):
        layer(torch.randn(2, 3, 16), Based(16, 2, feature_dim=4).new_state(2, torch.float32))
