"""compat's HGRN (``chunk_hgrn``, fla.ops.hgrn only, and ``fused_recurrent_hgrn``, also in
test_vs_naive.py and test_vs_fla.py) vs fla 0.6.0: its naive reference ``naive_recurrent_hgrn``
(float64 with its float32 casts promoted, and float32): T = 1, T = 130 (over fla's 128-token
block, not a multiple of it), with and without an initial state, forward and gradients; and its
Triton kernels under the interpreter (tests/fla_interpreter.py with its ``boolean_masks``,
float32): T = 1, T = 130 and, for the recurrent kernel (the chunk one takes no ``cu_seqlens``),
packed sequences with a length-1 piece, from initial states.

fla's ``naive_chunk_hgrn`` reshapes g to [B, chunk_size, D], so it only runs at T = chunk_size:
the recurrent naive is the naive pin. fla's ``chunk_hgrn`` backward reads only the output's
gradient (its final state is ``o[:, -1]`` outside the graph, and it returns no gradient for the
initial state): it is compared on the gradients of o w.r.t. x and g, the others against the
naive reference above.
"""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.compat.hgrn import hgrn

from .helpers import Promoted, assert_same, compare, recipe

hgrn_naive = pytest.importorskip("fla.ops.hgrn.naive")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
TOL = 5e-5  # test_vs_fla's float32 tolerance


def _leaves(T, N=1):
    """x, g [B, T, D = 16] and N initial states [N, D] from the recipe's v, gv and state."""
    x = recipe(T=T)
    h0 = x["h0"][:, :, 0].flatten(1)
    h0 = torch.cat([h0 * (-1) ** n for n in range(N)])
    return {"x": x["v"].flatten(2), "g": x["gv"].flatten(2)}, h0


def _fla_hgrn(monkeypatch):
    """fla.ops.hgrn under the interpreter, its chunk kernel's integer masks read as booleans."""
    pytest.importorskip("tests.fla_interpreter").boolean_masks(monkeypatch)
    return pytest.importorskip("fla.ops.hgrn")


@pytest.mark.parametrize("T", [1, 130])
def test_chunk_hgrn_equals_flas_kernel(T, monkeypatch):
    fla = _fla_hgrn(monkeypatch)
    leaves, h0 = _leaves(T)
    with torch.no_grad():
        ours = compat.chunk_hgrn(**leaves, initial_state=h0, output_final_state=True)
        theirs = fla.chunk_hgrn(**leaves, initial_state=h0, output_final_state=True)
    assert_same(list(ours), list(theirs), TOL, "o, S")
    compare(
        lambda **t: compat.chunk_hgrn(**t, initial_state=h0)[0],
        lambda **t: fla.chunk_hgrn(**t, initial_state=h0)[0],
        leaves, TOL,
    )  # fmt: skip


@pytest.mark.parametrize("cuts", [None, [0, 1, 9, 23]], ids=["T1", "packed"])
def test_fused_recurrent_hgrn_equals_flas_kernel(cuts, monkeypatch):
    """One token, and pieces of 1, 8 and 14 tokens from their own initial states; o, the
    final states and the gradients of every input and initial state."""
    fla = _fla_hgrn(monkeypatch)
    T, N = (1, 1) if cuts is None else (cuts[-1], len(cuts) - 1)
    leaves, h0 = _leaves(T, N)
    cu = None if cuts is None else torch.tensor(cuts)
    compare(
        lambda **t: compat.fused_recurrent_hgrn(**t, output_final_state=True, cu_seqlens=cu),
        lambda **t: fla.fused_recurrent_hgrn(**t, output_final_state=True, cu_seqlens=cu),
        {**leaves, "initial_state": h0}, TOL,
    )  # fmt: skip


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
