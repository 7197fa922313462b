"""compat's ``parallel_moba`` vs fla 0.6.0's ``parallel_moba`` run on the CPU (float32): T = 1,
T not a multiple of the block, packed sequences with a length-1 piece, topk = 1; o and the
gradients of q, k, v.

fla's MoBA is PyTorch (the blocks, the mean-key gate, the top-k choice, the two attention streams
and their log-sum-exp merge) around flash-attn's CUDA functions, and has no naive reference and
no Triton kernel. The three flash-attn functions it calls are stood in for here by their
definitions (``flash_attn_varlen_func``; ``_flash_attn_varlen_forward``: o and the log-sum-exp
[H, total_q] of each packed piece's softmax attention, causal aligned at the bottom right;
``_flash_attn_varlen_backward``: flash attention's gradients from a given o and log-sum-exp),
written out below, so that fla's own code runs and is what compat is compared with.
"""

from __future__ import annotations

import pytest
import torch

from linattn import compat

fla_moba = pytest.importorskip("fla.ops.moba.parallel")

H, D = 2, 8  # fla's merge reads d_output as [.., K]: V = K
TOL = 2e-5


def _pieces(cu_q, cu_k):
    bq, bk = cu_q.tolist(), cu_k.tolist()
    return zip(bq[:-1], bq[1:], bk[:-1], bk[1:], strict=True)


def _probabilities(q, k, scale, causal, lse=None):
    """Softmax weights [H, Tq, Tk] of one piece (from a given log-sum-exp [H, Tq] if any)."""
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if causal:
        Tq, Tk = q.shape[0], k.shape[0]
        keep = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = s.logsumexp(-1) if lse is None else lse
    return (s - lse[..., None]).exp(), lse


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
             causal, dropout_p=0.0, **_):  # fmt: skip
    """flash-attn's ``_flash_attn_varlen_forward``: (o, lse [H, total_q], None, None)."""
    outs, lses = [], []
    for a, b, c, d in _pieces(cu_seqlens_q, cu_seqlens_k):
        p, lse = _probabilities(q[a:b], k[c:d], softmax_scale, causal)
        outs.append(torch.einsum("hqk,khd->qhd", p, v[c:d].float()).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1), None, None


def _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
              max_seqlen_q, max_seqlen_k, softmax_scale, causal, **_):  # fmt: skip
    """flash-attn's ``_flash_attn_varlen_backward``: P = exp(s - lse), dv = P^T do,
    ds = P (do v^T - rowsum(do o)), dq = scale ds k, dk = scale ds^T q; written into dq, dk, dv."""
    for a, b, c, d in _pieces(cu_seqlens_q, cu_seqlens_k):
        p, _ = _probabilities(q[a:b], k[c:d], softmax_scale, causal, softmax_lse[:, a:b])
        do, o = dout[a:b].float(), out[a:b].float()
        dv[c:d] = torch.einsum("hqk,qhd->khd", p, do)
        dp = torch.einsum("qhd,khd->hqk", do, v[c:d].float())
        ds = p * (dp - (do * o).sum(-1).transpose(0, 1)[..., None])
        dq[a:b] = softmax_scale * torch.einsum("hqk,khd->qhd", ds, k[c:d].float())
        dk[c:d] = softmax_scale * torch.einsum("hqk,qhd->khd", ds, q[a:b].float())


def _varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                 softmax_scale=None, **_):  # fmt: skip
    """flash-attn's ``flash_attn_varlen_func`` (autograd through torch)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    outs = []
    for a, b, c, d in _pieces(cu_seqlens_q, cu_seqlens_k):
        p, _ = _probabilities(q[a:b], k[c:d], scale, causal)
        outs.append(torch.einsum("hqk,khd->qhd", p, v[c:d].float()).to(q.dtype))
    return torch.cat(outs)


@pytest.fixture
def fla_on_cpu(monkeypatch):
    monkeypatch.setattr(fla_moba, "flash_attn_varlen_func", _varlen_func)
    monkeypatch.setattr(fla_moba, "_flash_attn_varlen_forward", _forward)
    monkeypatch.setattr(fla_moba, "_flash_attn_varlen_backward", _backward)
    return fla_moba.parallel_moba


def _inputs(T, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(1, T, H, D, generator=gen) for n in ("q", "k", "v")}


def _run(fn, x, *args):
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o = fn(leaves["q"], leaves["k"], leaves["v"], *args)
    (o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum().backward()
    return [o.detach()] + [leaves[n].grad for n in ("q", "k", "v")]


CASES = {
    "T1": ([0, 1], 4, 3),  # no earlier block: fla's causal fallback
    "T33": ([0, 33], 4, 3),  # 8 whole blocks and a partial one
    "packed": ([0, 1, 18, 30], 4, 3),  # pieces of 1, 17 and 12 tokens
    "packed-topk5": ([0, 1, 18, 30], 3, 5),
    "topk1": ([0, 1, 18, 30], 4, 1),  # causal softmax attention (fla's fallback)
}


@pytest.mark.parametrize("case", CASES)
def test_parallel_moba_equals_flas(case, fla_on_cpu):
    cuts, chunk_size, topk = CASES[case]
    x = _inputs(cuts[-1])
    cu = torch.tensor(cuts, dtype=torch.int32)
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    args = (cu, max_seqlen, chunk_size, topk)
    ours, theirs = _run(compat.parallel_moba, x, *args), _run(fla_on_cpu, x, *args)
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, theirs, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=name)


def test_the_stand_ins_are_softmax_attention():
    """The stand-ins' o and gradients equal torch's causal softmax attention on each piece."""
    x = _inputs(12, seed=3)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (x[n][0] for n in ("q", "k", "v"))
    o, lse, _, _ = _forward(q, k, v, cu, cu, 7, 7, D**-0.5, True)
    dout = torch.randn(o.shape, generator=torch.Generator().manual_seed(4))
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _backward(dout, q, k, v, o, lse, dq, dk, dv, cu, cu, 7, 7, D**-0.5, True)
    for a, b in ((0, 5), (5, 12)):
        leaves = [t[a:b].transpose(0, 1).clone().requires_grad_(True) for t in (q, k, v)]
        want = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
        want.backward(dout[a:b].transpose(0, 1))
        torch.testing.assert_close(o[a:b], want.transpose(0, 1).detach(), rtol=1e-5, atol=1e-6)
        for got, leaf in zip((dq, dk, dv), leaves, strict=True):
            torch.testing.assert_close(got[a:b], leaf.grad.transpose(0, 1), rtol=1e-5, atol=1e-6)
