"""linattn.compat's MesaNet against fla 0.6.0: its naive references, and its Triton kernels under
the interpreter (tests/fla_interpreter; tiny shapes).

fla's full ``chunk_mesa_net`` keeps its per-chunk h_kv in bfloat16, which triton 3.9's
interpreter computes wrongly (tests/fla_interpreter's docstring), so its output is pinned in two
parts: the whole entry point's final states, and fla's CG kernel (``chunk_mesa_cg_fwd``, the solve
and the read) fed by fla's state kernel with ``states_in_fp32=True``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

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


@pytest.mark.parametrize("cu", [None, pytest.param([0, 1, 30, 45], marks=pytest.mark.slow)])
def test_chunk_mesa_net_equals_fla_s_kernels(cu):
    from fla.ops.mesa_net.chunk_cg_solver_fwd import chunk_mesa_cg_fwd
    from fla.ops.mesa_net.chunk_h_fwd import chunk_mesa_fwd_h
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    T = 45 if cu else 70  # not a multiple of fla's 64
    cu_seqlens = None if cu is None else torch.tensor(cu)
    q, k, v, g, beta, lamb = _inputs(T=T)
    N = 1 if cu is None else len(cu) - 1
    h_kk, h_kv = _states(N, 2, 16)
    q16, k16 = q.half(), k.half()  # fla's kernel computes with q and k in float16
    o, s_kk, s_kv = compat.chunk_mesa_net(q16.float(), k16.float(), v, g, beta, lamb, h_kk, h_kv,
                                          True, cu_seqlens=cu_seqlens)  # fmt: skip
    _, f_kk, f_kv = fla_mesa.chunk_mesa_net(q, k, v, g, beta, lamb, h_kk, h_kv, True,
                                            cu_seqlens=cu_seqlens)  # fmt: skip
    torch.testing.assert_close(s_kk, f_kk, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(s_kv, f_kv, rtol=1e-3, atol=1e-3)
    gc = chunk_local_cumsum(g, chunk_size=64, scale=RCP_LN2, cu_seqlens=cu_seqlens)
    h, hv, _, _ = chunk_mesa_fwd_h(k=k16, v=v, g=gc, beta=beta, h_init=h_kk, h_kv_init=h_kv,
                                   output_final_state=False, states_in_fp32=True,
                                   cu_seqlens=cu_seqlens, chunk_size=64)  # fmt: skip
    _, fo = chunk_mesa_cg_fwd(q=q16, k=k16, v=v, h=h, h_kv=hv, g_local_cumsum=gc, beta=beta,
                              lamb=lamb, cu_seqlens=cu_seqlens)  # fmt: skip
    error = ((o - fo).norm() / fo.norm()).item()
    assert error < 1e-3, error  # measured 2e-4: fla's CG runs its products in float16


def test_refusals_name_the_argument():
    q, k, v, g, beta, lamb = _inputs()
    with pytest.raises(ValueError, match="v must have shape"):
        compat.chunk_mesa_net(q, k, v[..., :8], g, beta, lamb)
    with pytest.raises(ValueError, match="lamb must have shape"):
        compat.chunk_mesa_net(q, k, v, g, beta, lamb[:1])
    with pytest.raises(TypeError, match="use_qk_l2norm_in_kernel must be a bool"):
        compat.chunk_mesa_net(q, k, v, g, beta, lamb, use_qk_l2norm_in_kernel="yes")
