"""fla's ``LogLinearMamba2`` layer and model on the CPU with ``enable()``.

fla 0.6.0's ``LogLinearMamba2.forward`` refuses the CPU; its ``cuda_kernels_forward`` runs under
Triton's interpreter, and is what the layer is compared with here (same weights and inputs):
the layer's prefill, and the model's prefill then token-by-token decoding against its whole
forward, a training step's gradients and ``generate``."""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
pytest.importorskip("fla")

import fla.layers  # noqa: E402
import fla.models  # noqa: E402

from linattn.integrations import fla as linattn_fla  # noqa: E402
from tests.compat.test_log_linear_attn import boolean_masks  # noqa: E402, F401

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


@pytest.fixture
def enabled():
    linattn_fla.enable()
    try:
        yield
    finally:
        linattn_fla.disable()


def _layer(seed=0):
    torch.manual_seed(seed)
    layer = fla.layers.LogLinearMamba2(num_heads=2, head_dim=32, hidden_size=32, state_size=64,
                                       expand=2, layer_idx=0).eval()  # fmt: skip
    with torch.no_grad():  # weights away from their constant initialisation
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def test_the_layer_equals_fla_s_kernels():
    theirs_layer = _layer()  # built before enable(): fla's own short convolution too
    x = torch.randn(1, 70, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs, _, _ = theirs_layer.cuda_kernels_forward(x, None, False, None)
    linattn_fla.enable()
    try:
        layer = _layer(seed=5)
        layer.load_state_dict(theirs_layer.state_dict())
        with torch.no_grad():
            ours, _, _ = layer(x)
    finally:
        linattn_fla.disable()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert theirs.abs().max() > 1e-2


def test_the_model_decodes_token_by_token_as_its_whole_forward(enabled):
    torch.manual_seed(0)
    config = fla.models.LogLinearMamba2Config(
        hidden_size=32, num_hidden_layers=2, num_heads=2, head_dim=32, state_size=16,
        vocab_size=50, expand=2, fuse_cross_entropy=False,
    )  # fmt: skip
    model = fla.models.LogLinearMamba2ForCausalLM(config)
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(2))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        whole = model(ids).logits
        out = model(ids[:, :7], use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for t in range(7, 20):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(logits, 1), whole, rtol=1e-5, atol=1e-5)
    generated = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False)
    assert generated.shape == (2, 9)
