"""fla's ``fused_attnres`` (attention residuals) against fla's ``naive_attnres`` and its Triton
kernel under the interpreter: output, weights and every gradient, with and without the fused
output norm, both checkpoint levels; the refusals. fla's kernel refuses tensors whose
``is_cuda`` is False (``fused_attnres_fwd``); its first source is handed over as a CPU tensor
that answers True (``CudaLooking``), which the interpreter then reads as any CPU tensor."""

from __future__ import annotations

import pytest
import torch

from linattn import compat

attnres = pytest.importorskip("fla.ops.attnres")
from fla.ops.attnres.naive import naive_attnres  # noqa: E402

D = 16


def _inputs(L=3, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return {"query": randn(D), "residuals": [randn(2, 7, D) for _ in range(L)],
            "rms_weight": 1 + 0.1 * randn(D), "output_rms_weight": 1 + 0.1 * randn(D)}  # fmt: skip


def _run(fn, x, fused_norm, **kw):
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items() if n != "residuals"}
    residuals = [r.clone().requires_grad_(True) for r in x["residuals"]]
    norm = leaves["output_rms_weight"] if fused_norm else None
    o, p = fn(leaves["query"], residuals, leaves["rms_weight"], norm, return_weights=True, **kw)
    (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
    grads = [leaves["query"].grad, leaves["rms_weight"].grad, *(r.grad for r in residuals)]
    if fused_norm:
        grads.append(leaves["output_rms_weight"].grad)
    return [o.detach(), p, *grads]


@pytest.mark.parametrize("fused_norm", [False, True])
@pytest.mark.parametrize("L", [1, 4])
def test_fused_attnres_matches_fla_s_naive(fused_norm, L):
    x = _inputs(L)
    ours = _run(compat.fused_attnres, x, fused_norm, scale=0.7, rms_eps=1e-5)
    theirs = _run(naive_attnres, x, fused_norm, scale=0.7, rms_eps=1e-5)
    assert ours[1].shape == (L, 2, 7) and ours[1].dtype == torch.float32
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class CudaLooking(torch.Tensor):
    """A CPU tensor past fla's check for CUDA tensors (the interpreter runs on the CPU)."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize("checkpoint_level", [0, 1])
@pytest.mark.parametrize("fused_norm", [False, True])
@pytest.mark.parametrize("L", [1, 4])
def test_fused_attnres_matches_fla_s_kernel(fused_norm, L, checkpoint_level):
    pytest.importorskip("tests.fla_interpreter")
    fused = pytest.importorskip("fla.ops.attnres.fused")

    def theirs(query, residuals, *args, **kw):
        residuals = [residuals[0].as_subclass(CudaLooking), *residuals[1:]]
        o, p = fused.fused_attnres(query, residuals, *args, **kw)
        return o.as_subclass(torch.Tensor), p.as_subclass(torch.Tensor)

    x = _inputs(L)
    kw = dict(scale=0.7, rms_eps=1e-5, checkpoint_level=checkpoint_level)
    ours = _run(compat.fused_attnres, x, fused_norm, **kw)
    for a, b in zip(ours, _run(theirs, x, fused_norm, **kw), strict=True):
        torch.testing.assert_close(a, b.as_subclass(torch.Tensor), rtol=1e-5, atol=1e-5)


def test_float64_runs_in_float64_and_bfloat16_returns_bfloat16():
    x = _inputs(3, torch.float64)
    o = compat.fused_attnres(x["query"], x["residuals"], x["rms_weight"])
    assert o.dtype == torch.float64
    # sum_l p_l = 1: one source repeated gives it back
    same = compat.fused_attnres(x["query"], [x["residuals"][0]] * 3, x["rms_weight"])
    torch.testing.assert_close(same, x["residuals"][0], rtol=0, atol=1e-14)
    b = _inputs(3, torch.bfloat16)
    assert compat.fused_attnres(b["query"], b["residuals"], b["rms_weight"]).dtype == torch.bfloat16


def test_refusals_name_the_argument():
    x = _inputs(2)
    q, rs, w = x["query"], x["residuals"], x["rms_weight"]
    with pytest.raises(ValueError, match="^residuals must be a non-empty"):
        compat.fused_attnres(q, [], w)
    with pytest.raises(ValueError, match=r"^residuals\[1\] must have"):
        compat.fused_attnres(q, [rs[0], rs[1][:, :3]], w)
    with pytest.raises(ValueError, match="^query must have"):
        compat.fused_attnres(q[:8], rs, w)
    with pytest.raises(ValueError, match="^rms_weight must have"):
        compat.fused_attnres(q, rs, w[:8])
    with pytest.raises(ValueError, match="^checkpoint_level"):
        compat.fused_attnres(q, rs, w, checkpoint_level=2)
    with pytest.raises(TypeError, match=r"^residuals\[0\] must be"):
        compat.fused_attnres(q, [None], w)
