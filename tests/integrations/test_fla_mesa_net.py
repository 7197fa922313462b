"""fla's MesaNet model on the CPU under ``linattn.integrations.fla.enable()``.

The op is pinned against fla's MesaNet kernel under the interpreter in
tests/compat/test_mesa_net.py, the layer against fla's layer in tests/layers/test_mesa.py; here
the model trains and generates."""

from __future__ import annotations

import pytest
import torch

from linattn.integrations import fla as fla_integration

pytest.importorskip("tests.fla_interpreter")  # before fla
fla_models = pytest.importorskip("fla.models")


@pytest.fixture
def enabled():
    fla_integration.enable()
    yield
    fla_integration.disable()


def assert_trains_like_its_float64_self(model_class, config) -> None:
    """One training step of ``model_class(config)`` in float32 and in float64 (the same weights
    and tokens): the losses within 1e-5, each parameter's gradient within 1e-3 of its largest
    float64 entry."""
    torch.manual_seed(0)
    model = model_class(config)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model64 = model.double()
    model64.zero_grad()
    loss64 = model64(ids, labels=ids).loss
    loss64.backward()
    torch.testing.assert_close(loss.double(), loss64, rtol=1e-5, atol=1e-5)
    for name, p in model64.named_parameters():
        scale = p.grad.abs().max().item() + 1e-12
        assert (grads[name].double() - p.grad).abs().max() / scale < 1e-3, name


def test_mesanet_model_trains_and_generates(enabled):
    config = fla_models.MesaNetConfig(
        hidden_size=32,
        num_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        vocab_size=50,
        fuse_cross_entropy=False,
    )
    torch.manual_seed(0)
    model = fla_models.MesaNetForCausalLM(config)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    lamb = model.model.layers[0].attn.lambda_params.grad
    assert lamb is not None and torch.isfinite(lamb).all() and lamb.abs().sum() > 0
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, :8], use_cache=True)
        last = model(ids[:, 8:], past_key_values=first.past_key_values, use_cache=True).logits
    torch.testing.assert_close(first.logits, full[:, :8], rtol=1e-5, atol=1e-5)
    # the decoding step starts fla's CG from Jacobi's guess, the chunk form from 0 (as fla's)
    assert (last[:, -1] - full[:, -1]).abs().max() < 1e-2


def test_path_model_trains_like_its_float64_self(enabled):
    config = fla_models.PaTHAttentionConfig(
        hidden_size=32,
        num_heads=2,
        num_hidden_layers=2,
        vocab_size=50,
        fuse_cross_entropy=False,
        use_forget_gate=True,
    )
    assert_trains_like_its_float64_self(fla_models.PaTHAttentionForCausalLM, config)


def test_deltaformer_model_trains_like_its_float64_self(enabled, monkeypatch):
    # fla's rotary embedding is a Triton kernel that another part of linattn ports to the CPU;
    # fla's own torch reference stands in for it here
    ops = pytest.importorskip("fla.modules.rotary.ops")

    def rotary(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, **_):
        T = x.shape[1]
        window = slice(seqlen_offsets, seqlen_offsets + T)
        return ops.rotary_embedding_ref(x, cos[window], sin[window], interleaved)

    monkeypatch.setattr(ops, "rotary_embedding", rotary)
    config = fla_models.DeltaFormerConfig(
        hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=50, fuse_cross_entropy=False
    )
    assert_trains_like_its_float64_self(fla_models.DeltaFormerForCausalLM, config)
