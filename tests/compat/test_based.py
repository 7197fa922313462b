"""compat's Based (``fused_chunk_based``, ``parallel_based``) and ReBased (``parallel_rebased``)
vs fla 0.6.0: its naive references (``fla.ops.based.naive``, ``fla.ops.rebased.naive``; float64
and float32) and its Triton kernels under the interpreter (float32: T = 1, T = 19, not a multiple
of the kernels' blocks; ``use_norm`` / ``use_normalize`` off; ReBased's ``return_both`` and
``use_scale=False``), forward and the gradients of q, k, v. fla has no states and no packed
sequences for either."""

from __future__ import annotations

import pytest
import torch

from linattn import compat

from .helpers import assert_same, compare, outputs_and_grads, recipe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])


def _leaves(T=19, H=2, K=16, V=8, dtype=torch.float32, seed=0):
    x = recipe(T=T, H=H, K=K, V=V, dtype=dtype, seed=seed)
    return {"q": x["q"], "k": x["k"], "v": x["v"]}


def _heads_first(fn):
    """fla's naive functions take [B, H, T, D]: as a [B, T, H, D] function."""
    return lambda q, k, v, **kw: fn(*(t.transpose(1, 2) for t in (q, k, v)), **kw).transpose(1, 2)


@DTYPES
@pytest.mark.parametrize("use_norm", [True, False])
@pytest.mark.parametrize("entry", ["fused_chunk_based", "parallel_based"])
def test_based_equals_the_naive_reference(dtype, use_norm, entry):
    naive = pytest.importorskip("fla.ops.based.naive")
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    compare(
        lambda **t: getattr(compat, entry)(**t, use_norm=use_norm),
        lambda **t: _heads_first(naive.naive_parallel_based)(**t, use_norm=use_norm),
        _leaves(dtype=dtype), tol,
    )  # fmt: skip


@DTYPES
@pytest.mark.parametrize("options", [{}, {"use_normalize": False}, {"use_scale": False}])
def test_rebased_equals_the_naive_reference(dtype, options):
    """fla's naive takes ``scale`` and adds 1e-6; its kernel entry point takes ``use_scale`` and
    ``eps`` (1e-5 by default): the naive is called with the entry point's scale and eps 1e-6."""
    naive = pytest.importorskip("fla.ops.rebased.naive")
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    scale = 1.0 if options.get("use_scale") is False else 16**-0.5
    compare(
        lambda **t: compat.parallel_rebased(**t, eps=1e-6, **options),
        lambda **t: _heads_first(naive.naive_parallel_rebased)(
            **t, scale=scale, use_norm=options.get("use_normalize", True)
        ),
        _leaves(dtype=dtype), tol,
    )  # fmt: skip


KERNEL_CASES = [
    ("fused_chunk_based", 1, {}),
    ("fused_chunk_based", 19, {"use_norm": False}),
    ("parallel_based", 1, {}),
    ("parallel_based", 19, {"scale": 0.3}),
    ("parallel_rebased", 1, {}),
    ("parallel_rebased", 19, {"use_scale": False, "eps": 1e-3}),
    ("parallel_rebased", 19, {"use_normalize": False}),
]


@pytest.mark.parametrize(
    "name,T,kwargs", KERNEL_CASES, ids=[f"{n}-T{T}-{i}" for i, (n, T, _) in enumerate(KERNEL_CASES)]
)
def test_equals_fla_s_kernels(name, T, kwargs):
    pytest.importorskip("tests.fla_interpreter")
    ops = pytest.importorskip("fla.ops")
    rebased = pytest.importorskip("fla.ops.rebased")
    fla = getattr(rebased if name == "parallel_rebased" else ops, name)
    leaves = _leaves(T=T)
    a, da = outputs_and_grads(lambda **t: getattr(compat, name)(**t, **kwargs), leaves)
    b, db = outputs_and_grads(lambda **t: fla(**t, **kwargs), leaves)
    assert_same(a, b, 5e-5, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], 5e-5, f"{name} d{n}")


def test_rebased_return_both_is_fla_s_numerator_and_denominator():
    pytest.importorskip("tests.fla_interpreter")
    rebased = pytest.importorskip("fla.ops.rebased")
    leaves = _leaves(T=19)
    a = compat.parallel_rebased(**leaves, return_both=True)
    b = rebased.parallel_rebased(**leaves, return_both=True)
    assert [t.shape for t in a] == [(1, 2, 19, 8), (1, 2, 19)]
    assert_same(list(a), list(b), 5e-5, "return_both")


def test_bad_input_is_refused_naming_the_argument():
    x = _leaves(T=5)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        compat.parallel_based(x["q"], x["k"][..., :8], x["v"])
    with pytest.raises(ValueError, match="v must have H = 2 heads"):
        compat.fused_chunk_based(x["q"], x["k"], torch.cat([x["v"], x["v"]], 2))
    with pytest.raises(TypeError, match="use_norm must be a bool"):
        compat.parallel_based(**x, use_norm="no")
    with pytest.raises(TypeError, match="scale must be None or a float"):
        compat.parallel_based(**x, scale="0.5")
    with pytest.raises(TypeError, match="use_normalize must be a bool"):
        compat.parallel_rebased(**x, use_normalize=1)
    with pytest.raises(ValueError, match="eps must be a real number >= 0"):
        compat.parallel_rebased(**x, eps=-1.0)
    with pytest.raises(TypeError, match="v must be a floating-point tensor"):
        compat.parallel_rebased(x["q"], x["k"], x["v"].long())


@pytest.mark.parametrize("name", ["based", "rebased"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("T,chunk_size", [(1, 4), (37, 8), (40, 8)])
def test_the_polynomial_chunk_form_equals_linear_attention_on_the_features(
    name, normalize, T, chunk_size
):
    # the kernel from the K-wide scores inside a chunk and the features only in the state,
    # against linear attention on the whole feature map (the recurrent form), float64: o, z and
    # the gradients of q, k, v
    from linattn import features
    from linattn.compat import based, rebased

    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, T, 3, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    scale = 0.4
    if name == "based":
        coefficients, feature = based.TAYLOR, features.taylor_exp
    else:
        coefficients, feature = rebased.SQUARE, rebased.squared_features

    def run(chunked):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if chunked:
            o, z = based.polynomial_attention(*leaves, coefficients, scale, 1e-6, normalize,
                                              chunk_size)  # fmt: skip
        else:
            phi_q, phi_k = feature(leaves[0], scale), feature(leaves[1], scale)
            o, z = based.kernel_attention(phi_q, phi_k, leaves[2], 1e-6, normalize, "recurrent")
        weights = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
        ((o * weights).sum() + z.sum()).backward()
        return [o, z, *(t.grad for t in leaves)]

    for ours, theirs in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
