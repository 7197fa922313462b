"""compat's HGRN (``chunk_hgrn``, fla.ops.hgrn only; ``fused_recurrent_hgrn`` is pinned in
test_vs_naive.py and test_vs_fla.py) vs fla 0.6.0's naive reference ``naive_recurrent_hgrn``
(float64 with its float32 casts promoted, and float32): T = 1, T = 130 (over fla's 128-token
block, not a multiple of it), with and without an initial state, forward and gradients.

fla's ``chunk_hgrn`` kernel does not run under triton 3.9's interpreter ("mask has unsupported
dtype" in ``chunk_hgrn_fwd_kernel_h``), and fla's ``naive_chunk_hgrn`` reshapes g to
[B, chunk_size, D], so it only runs at T = chunk_size: the recurrent naive is the pin.
"""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.compat.hgrn import hgrn

from .helpers import Promoted, compare, recipe

hgrn_naive = pytest.importorskip("fla.ops.hgrn.naive")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("T", [1, 130])
@pytest.mark.parametrize("with_state", [True, False], ids=["h0", "no_h0"])
def test_chunk_hgrn_equals_the_naive_reference(dtype, T, with_state, monkeypatch):
    if dtype == torch.float64:
        monkeypatch.setattr(hgrn_naive, "torch", Promoted())
        to_float = torch.Tensor.float
        monkeypatch.setattr(
            torch.Tensor, "float", lambda x: x if x.dtype == torch.float64 else to_float(x)
        )
    x = recipe(T=T, dtype=dtype)
    leaves = {"x": x["v"].flatten(2), "g": x["gv"].flatten(2)}
    if with_state:
        leaves["initial_state"] = x["h0"][:, :, 0].flatten(1)
    tol = 1e-12 if dtype == torch.float64 else 3e-5
    compare(
        lambda **t: compat.chunk_hgrn(**t, output_final_state=True),
        lambda **t: hgrn_naive.naive_recurrent_hgrn(**t, output_final_state=True),
        leaves, tol,
    )  # fmt: skip


def test_chunk_hgrn_refuses_bad_input_naming_the_argument():
    x, g = torch.randn(1, 5, 4), -torch.rand(1, 5, 4)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, D\] as x"):
        compat.chunk_hgrn(x, g[..., :3])
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        compat.chunk_hgrn(x.long(), g)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, D\]"):
        compat.chunk_hgrn(x, g, torch.zeros(1, 4, 1))
    assert compat.chunk_hgrn(x, g)[1] is None


def test_the_chunk_form_of_packed_sequences_equals_the_recurrent_form():
    # three sequences, one empty, each from its own state: the chunk form (diagonal_recurrence,
    # sequence by sequence) against the recurrent form (linear_attention), values and gradients
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 41, 6, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, 41, 6, generator=gen, dtype=torch.float64)
    h0 = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 17, 17, 41])

    def run(mode):
        leaves = [t.clone().requires_grad_(True) for t in (x, g, h0)]
        o, S = hgrn(*leaves, output_final_state=True, cu_seqlens=cu, mode=mode, chunk_size=4)
        (o.sin().sum() + S.square().sum()).backward()
        return [o, S, *(t.grad for t in leaves)]

    for ours, theirs in zip(run("chunk"), run("recurrent"), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
