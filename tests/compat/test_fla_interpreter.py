"""The triton-interpreter shim (tests/fla_interpreter.py): one fla op and one fla layer, CPU."""

from __future__ import annotations

import warnings

import pytest

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
pytest.importorskip("fla")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def _inputs(B=1, T=64, H=2, K=32, V=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen))
    beta = torch.rand(B, T, H, generator=gen)
    return q, k, v, g, beta


def test_chunk_gated_delta_rule_runs_and_matches_fla_naive():
    """fla's Triton chunk kernel (l2norm in kernel) vs its pure-PyTorch recurrence, fwd + grads."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    leaves = [t.requires_grad_() for t in _inputs()]
    q, k, v, g, beta = leaves
    o, S = chunk_gated_delta_rule(
        q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    (o.sum() + S.sum()).backward()
    got = [o, S] + [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    qn, kn = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
    o2, S2 = naive_recurrent_gated_delta_rule(qn, kn, v, beta, g, output_final_state=True)
    (o2.sum() + S2.sum()).backward()
    want = [o2, S2] + [t.grad for t in leaves]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_gated_delta_net_layer_chunk_equals_fused_recurrent():
    """fla's GatedDeltaNet layer (short conv, fused gated norm, l2norm) runs fwd + bwd on the CPU.

    In training it takes the chunk kernels, in eval at T <= 64 the fused recurrent kernel: two
    different Triton algorithms that must agree.
    """
    from fla.layers import GatedDeltaNet

    torch.manual_seed(0)
    layer = GatedDeltaNet(hidden_size=64, head_dim=16, num_heads=4)
    x = torch.randn(2, 32, 64, requires_grad=True)
    y_chunk = layer.train()(x)[0]
    y_chunk.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad(), warnings.catch_warnings():
        y_rec = layer.eval()(x)[0]
    torch.testing.assert_close(y_chunk.detach(), y_rec, rtol=1e-4, atol=1e-5)


def test_interpreter_is_on():
    import os

    import triton

    assert fla_interpreter.ACTIVE
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert triton.knobs.runtime.interpret
