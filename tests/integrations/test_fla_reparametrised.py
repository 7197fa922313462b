"""fla 0.6.0's Based, ReBased and HGRN layers on the CPU with ``linattn.integrations.fla.enable()``
(``parallel_based``, ``parallel_rebased`` and ``fused_recurrent_hgrn`` computed by
``linattn.compat``) equal the same layers on fla's own kernels under Triton's interpreter: output,
input and weight gradients (Based, ReBased); HGRN's output in inference (fla's layer trains with
``chunk_hgrn``, whose kernel the interpreter cannot run: tests/compat/test_hgrn.py)."""

from __future__ import annotations

import pytest
import torch

interp = pytest.importorskip("tests.fla_interpreter")  # before fla
fla_layers = pytest.importorskip("fla.layers")

from linattn import compat  # noqa: E402
from linattn.integrations import fla as linattn_fla  # noqa: E402

D, TOL = 32, 1e-5
LAYERS = {
    "based": lambda: fla_layers.BasedLinearAttention(
        hidden_size=D, feature_dim=8, num_heads=2, num_key_value_heads=2, mode="parallel"
    ),
    "rebased": lambda: fla_layers.ReBasedLinearAttention(
        hidden_size=D, feature_dim=8, num_heads=2, num_key_value_heads=2, mode="parallel"
    ),
}
ENTRY = {"based": "parallel_based", "rebased": "parallel_rebased"}


def _run(module, x, w):
    module.zero_grad()
    x = x.clone().requires_grad_()
    out = module(x)
    y = out[0] if isinstance(out, tuple) else out
    (y * w).sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in module.parameters()]


def test_hgrn_layer_on_linattn_equals_fla_s_kernel_in_inference(monkeypatch):
    torch.manual_seed(0)
    module = fla_layers.HGRNAttention(hidden_size=D, layer_idx=0).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 23, D)
    with torch.no_grad():
        theirs = module(x)[0]
        calls = []
        entry = compat.fused_recurrent_hgrn
        monkeypatch.setattr(
            compat, "fused_recurrent_hgrn", lambda *a, **k: calls.append(1) or entry(*a, **k)
        )
        linattn_fla.enable()
        try:
            ours = module(x)[0]
        finally:
            linattn_fla.disable()
    assert calls, "linattn's fused_recurrent_hgrn did not run"
    assert float((ours - theirs).norm() / theirs.norm()) < TOL


@pytest.mark.parametrize("name", LAYERS)
def test_layer_on_linattn_equals_fla_s_kernels(name, monkeypatch):
    torch.manual_seed(0)
    module = LAYERS[name]()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, w = torch.randn(2, 23, D), torch.randn(2, 23, D)
    theirs = _run(module, x, w)
    calls = []
    entry = getattr(compat, ENTRY[name])
    monkeypatch.setattr(compat, ENTRY[name], lambda *a, **k: calls.append(1) or entry(*a, **k))
    linattn_fla.enable()
    try:
        ours = _run(module, x, w)
    finally:
        linattn_fla.disable()
    assert calls, f"linattn's {ENTRY[name]} did not run"
    for a, b in zip(ours, theirs, strict=True):
        assert float((a - b).norm() / b.norm()) < TOL
