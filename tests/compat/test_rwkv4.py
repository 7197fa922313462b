"""compat's RWKV-4 (``fused_recurrent_rwkv4``) vs fla 0.6.0's Triton kernel under the
interpreter (float32: T = 1, T = 19, keys large enough that the running maximum matters,
forward and the gradients of every input), and its forms against the float64 reference
(``linattn.reference.rwkv4``; fla has no naive RWKV-4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn import compat
from linattn.compat import rwkv4
from linattn.reference.rwkv4 import wkv as reference

from .helpers import assert_same, outputs_and_grads

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def _leaves(B=2, T=19, C=6, k_scale=1.0, dtype=torch.float32, seed=0):
    """w, u ~ N(0, 1) [C]; k ~ k_scale N(0, 1), v ~ N(0, 1) [B, T, C]; the state (alpha ~ N(0, 1),
    beta ~ U(0.1, 1.1), eps ~ N(0, 1)) [B, 3, 1, C]."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    beta = 0.1 + torch.rand(B, C, generator=gen, dtype=torch.float64)
    state = torch.stack([randn(B, C), beta, randn(B, C)], 1).unsqueeze(2)
    x = {"w": randn(C), "u": randn(C), "k": k_scale * randn(B, T, C), "v": randn(B, T, C),
         "state": state}  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


@pytest.mark.parametrize(
    "T,k_scale",
    [(1, 1.0), pytest.param(19, 1.0, marks=pytest.mark.slow), (19, 30.0)],
    ids=["T1", "T19", "k30"],
)
def test_equals_fla_s_kernel(T, k_scale):
    pytest.importorskip("tests.fla_interpreter")
    fla = pytest.importorskip("fla.ops.rwkv4")
    leaves = _leaves(T=T, k_scale=k_scale)
    a, da = outputs_and_grads(lambda **t: compat.fused_recurrent_rwkv4(**t), leaves)
    b, db = outputs_and_grads(lambda **t: fla.fused_recurrent_rwkv4(**t), leaves)
    assert_same(a, b, 5e-5, "fused_recurrent_rwkv4")
    for n in leaves:
        assert_same([da[n]], [db[n]], 5e-5, f"d{n}")


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_every_form_equals_the_float64_reference(mode):
    leaves = _leaves(T=21, k_scale=3.0, dtype=torch.float64)
    o, S = rwkv4.wkv(**leaves, mode=mode, chunk_size=8)
    for n in range(2):
        ref_o, ref_S = reference(
            leaves["w"].numpy(), leaves["u"].numpy(), leaves["k"][n].numpy(),
            leaves["v"][n].numpy(), initial_state=leaves["state"][n, :, 0].numpy(),
        )  # fmt: skip
        np.testing.assert_allclose(o[n].numpy(), ref_o, rtol=0, atol=1e-12)
        np.testing.assert_allclose(S[n, :, 0].numpy(), ref_S, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 37])
def test_the_chunk_form_s_gradients_equal_the_recurrent_form_s(T):
    # chunks of 4 over 37 tokens: chunks of chunks and a partial one; every input, the state
    # included, through the output and the whole final state (alpha, beta, eps)
    leaves = _leaves(T=T, k_scale=3.0, dtype=torch.float64)

    def run(mode):
        x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
        o, S = rwkv4.wkv(**x, mode=mode, chunk_size=4)
        weights = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
        ((o * weights).sum() + (S * S).sum()).backward()
        return [o, S, *(t.grad for t in x.values())]

    for ours, theirs in zip(run("chunk"), run("recurrent"), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_the_running_maximum_keeps_large_keys_finite():
    """exp(k) overflows float32 at k ~ 89; fla's state (alpha, beta, eps) never forms it."""
    leaves = _leaves(T=12, k_scale=200.0)
    o, S = compat.fused_recurrent_rwkv4(**leaves)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o64, _ = rwkv4.wkv(**{n: t.double() for n, t in leaves.items()}, mode="recurrent")
    torch.testing.assert_close(o.double(), o64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(w=torch.zeros(5)), r"w must have shape \[C\]"),
        (dict(u=torch.zeros(2, 6)), r"u must have shape \[C\]"),
        (dict(k=torch.zeros(2, 19, 6, 1)), r"k must have shape \[B, T, C\]"),
        (dict(v=torch.zeros(2, 18, 6)), "v must have the shape of k"),
        (dict(state=torch.zeros(2, 3, 6)), r"state must have shape \[B, 3, 1, C\]"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        compat.fused_recurrent_rwkv4(**{**_leaves(), **change})
    with pytest.raises(TypeError, match="k must be a floating-point tensor"):
        compat.fused_recurrent_rwkv4(**{**_leaves(), "k": torch.zeros(2, 19, 6, dtype=torch.long)})
    with pytest.raises(ValueError, match="mode must be one of"):
        rwkv4.wkv(**_leaves(), mode="scan")
