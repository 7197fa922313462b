"""linattn.compat's MesaNet against fla 0.6.0: its naive references, and its Triton kernels under
the interpreter (tests/fla_interpreter; tiny shapes).

fla's ``chunk_mesa_net`` keeps its per-chunk h_kv (the G_t of the value memory) in bfloat16, and
triton 3.9's interpreter gets two bfloat16 operations wrong: ``tl.dot`` of bfloat16 tiles
multiplies their bit patterns as integers, and a float32 to bfloat16 cast truncates instead of
rounding (tests/compat/test_interpreter_bfloat16.py reproduces both in one-op kernels). Those are
the only bfloat16 operations in fla's MesaNet: the state kernel ``chunk_mesa_net_fwd_kernel_h``
stores h_kv with the cast, and the CG kernel ``chunk_fwd_mesa_cg_dim64_kernel`` reads it in
``o = G^T (x exp(g))`` with the cast of x and the dot (its backward widens h_kv to float32). So
fla's whole kernel, forward and backward, is run two ways, fla's files untouched:

- float32 states: ``chunk_mesa_fwd_h``, which ``chunk_mesa_net`` calls with fla's own
  ``states_in_fp32=False`` (forward and the backward's recomputation), is called with ``True``,
  so h_kv is stored in float32 as h_kk already is. Nothing else changes: fla's float16 q and k,
  its CG with float16 products, its backward kernels and float16 dh are all fla's, so the
  comparison with linattn (fed the same float16-rounded q and k) pins fla's semantics to
  float16's rounding.
- bfloat16 states: fla unchanged, under ``fla_interpreter.bfloat16_dots_and_casts``, which makes
  the dot and the cast compute as compiled triton does; it then differs from linattn by its
  bfloat16 rounding of h_kv and x.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
fla_mesa = pytest.importorskip("fla.ops.mesa_net")


def _inputs(B=1, T=20, H=2, K=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, K, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2)
    beta = torch.rand(B, T, H, generator=gen)
    lamb = torch.rand(H, K, generator=gen) + 0.25
    return q, k, v, g, beta, lamb


def _states(N, H, K, seed=1):
    gen = torch.Generator().manual_seed(seed)
    root = torch.randn(N, H, K, K, generator=gen) / K
    return root @ root.transpose(-1, -2), torch.randn(N, H, K, K, generator=gen)


@pytest.mark.parametrize("T", [1, 20])
def test_exact_solve_equals_fla_s_naive_exact(T):
    q, k, v, g, beta, lamb = _inputs(T=T)
    h_kk, h_kv = _states(1, 2, 16)
    want, w_kk, w_kv = fla_mesa.naive_mesa_net_exact(q, k, v, g, lamb, beta, h_kk, h_kv)
    o, s_kk, s_kv = compat.chunk_mesa_net(q.double(), k.double(), v.double(), g.double(),
                                          beta.double(), lamb.double(), h_kk.double(),
                                          h_kv.double(), True, 40)  # fmt: skip
    # fla's own CG (1e-5 guards) stalls short of the exact solve; linattn's op with cg_eps=0
    # reaches it: both are compared with fla's float32 exact solve
    from linattn.ops.mesa import mesa_net

    exact, *_ = mesa_net(q.double(), k.double(), v.double(), g.double(), beta.double(),
                         lamb.double(), h_kk_init=h_kk.double(), h_kv_init=h_kv.double(),
                         max_cg_iterations=16, cg_eps=0.0)  # fmt: skip
    torch.testing.assert_close(exact.float(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_kk.float(), w_kk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_kv.float(), w_kv, rtol=1e-5, atol=1e-5)
    assert (o.float() - want).abs().max() < 5e-2  # fla's 30-40 guarded CG steps


def test_fla_s_cg_at_its_default_iterations_equals_fla_s_naive_chunked_cg():
    # fla's naive_mesa_net_CG (naive.py, not exported) solves as its kernel does: x_0 = 0, the
    # 1e-5 guards, 30 steps; T a multiple of its chunk
    from fla.ops.mesa_net.naive import naive_mesa_net_CG

    q, k, v, g, beta, lamb = _inputs(B=2, T=32)
    h_kk, h_kv = _states(2, 2, 16)
    want, w_kk, w_kv = naive_mesa_net_CG(q, k, v, g, lamb, beta, 16, 30, h_kk, h_kv)
    o, s_kk, s_kv = compat.chunk_mesa_net(q, k, v, g, beta, lamb, h_kk, h_kv, True)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_kk, w_kk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s_kv, w_kv, rtol=1e-5, atol=1e-5)
    # fewer steps differ: the iteration count is honoured
    o10, *_ = compat.chunk_mesa_net(q, k, v, g, beta, lamb, h_kk, h_kv, max_CG_iteration=3)
    assert (o10 - want).abs().max() > 1e-3


def test_the_decoding_step_equals_fla_s_naive_and_kernel():
    q, k, v, g, beta, lamb = _inputs(B=3, T=1)
    h_kk, h_kv = _states(3, 2, 16)
    args = (q[:, 0], k[:, 0], v[:, 0], g[:, 0], lamb, beta[:, 0], h_kk, h_kv)
    ours = compat.mesa_net_decoding_one_step(*args)
    for theirs in (fla_mesa.naive_mesa_net_decoding_one_step(*args),
                   fla_mesa.mesa_net_decoding_one_step(*args)):  # fmt: skip
        for a, b in zip(ours, theirs, strict=False):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _float32_states(monkeypatch):
    """fla's ``chunk_mesa_net`` with its h_kv chunk states kept in float32 (module docstring)."""
    import fla.ops.mesa_net.chunk as fla_chunk

    state_kernel = fla_chunk.chunk_mesa_fwd_h

    def in_float32(*args, **kwargs):
        return state_kernel(*args, **{**kwargs, "states_in_fp32": True})

    monkeypatch.setattr(fla_chunk, "chunk_mesa_fwd_h", in_float32)


def _forward_backward(run, inputs, cu_seqlens, cotangents):
    leaves = [x.clone().requires_grad_() for x in inputs]
    o, h_kk, h_kv = run(*leaves, True, cu_seqlens=cu_seqlens)
    do, dh_kk, dh_kv = cotangents
    ((o * do).sum() + (h_kk * dh_kk).sum() + (h_kv * dh_kv).sum()).backward()
    return (o, h_kk, h_kv), [x.grad for x in leaves]


def _case(T, cu):
    cu_seqlens = None if cu is None else torch.tensor(cu)
    N = 1 if cu is None else len(cu) - 1
    q, k, v, g, beta, lamb = _inputs(T=T)
    # fla's kernel rounds q and k to float16 first: linattn is fed the same rounded values
    q, k = q.half().float(), k.half().float()
    h_kk, h_kv = _states(N, 2, 16)
    gen = torch.Generator().manual_seed(2)
    cotangents = (torch.randn(q.shape, generator=gen), torch.randn(h_kk.shape, generator=gen),
                  torch.randn(h_kv.shape, generator=gen))  # fmt: skip
    return (q, k, v, g, beta, lamb, h_kk, h_kv), cu_seqlens, cotangents


GRADIENTS = ("q", "k", "v", "g", "beta", "lamb", "h_kk_init", "h_kv_init")
CASES = [  # T = 1; T not a multiple of fla's chunk of 64; packed, with pieces of length 1
    pytest.param(1, None, id="T1"),
    pytest.param(70, None, id="T70"),
    pytest.param(45, [0, 1, 30, 31, 45], id="packed", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("T", "cu"), CASES)
def test_chunk_mesa_net_equals_fla_s_kernel_with_float32_states(monkeypatch, T, cu):
    _float32_states(monkeypatch)
    inputs, cu_seqlens, cotangents = _case(T, cu)
    theirs, their_grads = _forward_backward(fla_mesa.chunk_mesa_net, inputs, cu_seqlens,
                                            cotangents)  # fmt: skip
    ours, our_grads = _forward_backward(compat.chunk_mesa_net, inputs, cu_seqlens, cotangents)
    for name, a, b in zip(("o", "h_kk", "h_kv"), ours, theirs, strict=True):
        error = fla_interpreter.relative(a, b)
        assert error < 1e-3, (name, error)  # fla's float16 products: 2 to 5 of its 4.9e-4 units
    for name, a, b in zip(GRADIENTS, our_grads, their_grads, strict=True):
        error = fla_interpreter.relative(a, b)
        assert error < 3e-3, (name, error)  # and its float16 dq*, dh and CG backward: up to 3


def test_chunk_mesa_net_equals_fla_s_bfloat16_kernel(monkeypatch):
    fla_interpreter.bfloat16_dots_and_casts(monkeypatch)
    inputs, cu_seqlens, cotangents = _case(70, None)
    (o_bf16, *_), grads_bf16 = _forward_backward(fla_mesa.chunk_mesa_net, inputs, cu_seqlens,
                                                 cotangents)  # fmt: skip
    (o, *_), grads = _forward_backward(compat.chunk_mesa_net, inputs, cu_seqlens, cotangents)
    _float32_states(monkeypatch)
    (o_fp32, *_), _ = _forward_backward(fla_mesa.chunk_mesa_net, inputs, cu_seqlens, cotangents)
    # fla's read o = x^T ... + G^T (x exp(g)) rounds both h_kv and x to bfloat16 (2^-9 each):
    # within two of those units of linattn's float32 and of fla's own float32-state run
    assert fla_interpreter.relative(o, o_bf16) < 2**-8
    assert 1e-4 < fla_interpreter.relative(o_fp32, o_bf16) < 2**-8  # bfloat16 was in effect
    for name, a, b in zip(GRADIENTS, grads, grads_bf16, strict=True):
        error = fla_interpreter.relative(a, b)
        assert error < 2**-8, (name, error)


def test_refusals_name_the_argument():
    q, k, v, g, beta, lamb = _inputs()
    with pytest.raises(ValueError, match="v must have shape"):
        compat.chunk_mesa_net(q, k, v[..., :8], g, beta, lamb)
    with pytest.raises(ValueError, match="lamb must have shape"):
        compat.chunk_mesa_net(q, k, v, g, beta, lamb[:1])
    with pytest.raises(TypeError, match="use_qk_l2norm_in_kernel must be a bool"):
        compat.chunk_mesa_net(q, k, v, g, beta, lamb, use_qk_l2norm_in_kernel="yes")
