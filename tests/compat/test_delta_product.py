"""compat.chunk_gated_delta_product vs fla 0.6.0: fla's naive token loop
(``naive_recurrent_gated_delta_product``), and its Triton kernels under triton's interpreter in
float32, forward and gradients, with grouped-free heads, ``cu_seqlens`` and initial states (T = 1,
T not a multiple of the chunk, packed sequences with a length-1 piece).

fla's public ``chunk_gated_delta_product`` asserts that q is not float32 (its GPU kernels want
bfloat16), and the interpreter's bfloat16 is wrong (``tests/fla_interpreter``): the kernels are
called here through the autograd function the wrapper calls, ``ChunkGatedDeltaProductFunction``,
with the wrapper's own arguments, in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
chunk_module = pytest.importorskip("fla.ops.gated_delta_product.chunk")
naive_module = pytest.importorskip("fla.ops.gated_delta_product.naive")

from linattn import compat  # noqa: E402

from .helpers import assert_same, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def inputs(T=20, n=2, H=2, K=16, V=8, N=1, dtype=torch.float32, seed=0):
    """fla's recipe (tests/ops/test_gated_delta_product.py): k l2-normalised, beta = sigmoid,
    g = logsigmoid; k, v, beta with T n rows; one initial state per sequence."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(1, T, H, K), "k": F.normalize(randn(1, T * n, H, K), dim=-1),
        "v": randn(1, T * n, H, V), "g": F.logsigmoid(randn(1, T, H)),
        "beta": randn(1, T * n, H).sigmoid(), "initial_state": randn(N, H, K, V),
    }  # fmt: skip
    return {name: t.to(dtype) for name, t in x.items()}


def fla_kernel(q, k, v, g, beta, initial_state, *, n, cu_seqlens=None, l2norm=False):
    """fla's chunk kernels with the arguments its wrapper passes (scale 1 / sqrt(K))."""
    return chunk_module.ChunkGatedDeltaProductFunction.apply(
        q, k, v, g, beta, q.shape[-1] ** -0.5, n, initial_state, True, l2norm, cu_seqlens,
        None, None,
    )  # fmt: skip


def ours(q, k, v, g, beta, initial_state, *, n, cu_seqlens=None, l2norm=False):
    return compat.chunk_gated_delta_product(
        q, k, v, g, beta, n, initial_state=initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens,
    )  # fmt: skip


@pytest.mark.parametrize(
    "n,cu,l2norm,T",
    [(2, None, False, 20), (3, [0, 7, 20], True, 20), (2, None, False, 1),
     (2, [0, 1, 9, 23], False, 23)],
    ids=["n2", "n3-varlen-l2norm", "T1", "packed-length-1"],
)  # fmt: skip
def test_agrees_with_fla_kernels(n, cu, l2norm, T):
    x = inputs(T=T, n=n, N=1 if cu is None else len(cu) - 1)
    kw = {"n": n, "cu_seqlens": None if cu is None else torch.tensor(cu), "l2norm": l2norm}
    a, da = outputs_and_grads(lambda **t: ours(**t, **kw), x)
    b, db = outputs_and_grads(lambda **t: fla_kernel(**t, **kw), x)
    assert_same(a, b, 5e-5, "chunk_gated_delta_product")
    for name in x:
        assert_same([da[name]], [db[name]], 5e-5, f"chunk_gated_delta_product d{name}")


@pytest.mark.parametrize("gate", [True, False])
def test_agrees_with_fla_naive_reference(gate):
    """fla's naive loop computes in float32 (it casts q, k, v, beta): a float32 tolerance."""
    x = inputs(n=3, N=2, dtype=torch.float64)
    g = x["g"] if gate else None
    cu = torch.tensor([0, 9, 20])
    o, S = compat.chunk_gated_delta_product(
        x["q"], x["k"], x["v"], g, x["beta"], 3, initial_state=x["initial_state"],
        output_final_state=True, cu_seqlens=cu,
    )  # fmt: skip
    want = naive_module.naive_recurrent_gated_delta_product(
        x["q"], x["k"], x["v"], g, x["beta"], scale=16**-0.5, cu_seqlens=cu,
        initial_state=x["initial_state"], output_final_state=True, num_householder=3,
    )  # fmt: skip
    assert_same([o, S], list(want), 2e-5, "naive_recurrent_gated_delta_product")


def test_fla_s_checks():
    x = inputs(n=2)
    with pytest.raises(ValueError, match=r"k must have T \* num_householder"):
        compat.chunk_gated_delta_product(x["q"], x["k"], x["v"], x["g"], x["beta"], 3)
    with pytest.raises(NotImplementedError, match="cp_context"):
        compat.chunk_gated_delta_product(
            x["q"], x["k"], x["v"], x["g"], x["beta"], 2, cp_context=object()
        )
    with pytest.raises(ValueError, match="number of initial states"):
        compat.chunk_gated_delta_product(
            x["q"], x["k"], x["v"], x["g"], x["beta"], 2, initial_state=x["initial_state"],
            cu_seqlens=torch.tensor([0, 5, 20]),
        )  # fmt: skip
