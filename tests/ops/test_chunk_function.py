"""The chunk form's autograd function: groups of chunks, saved states, recomputed backward.

Its outputs and gradients must equal those of plain autograd through the block-by-block engine
(``chunk.chunk_forward``, itself tested against the float64 oracle) for every gate, rule, chunk
size and group size, including chunks that do not divide T and groups of one chunk.
"""

import itertools

import pytest
import torch

from linattn.ops import _blockmath, chunk_function
from linattn.ops.chunk import chunk_forward

from .cases import make_inputs


def _internal(x, names):
    """Public [B, T, H, ...] tensors -> internal [B, H, T, ...] (scalar gates as [B, H, T, 1])."""
    out = []
    for name in names:
        t = x.get(name)
        if t is None:
            out.append(None)
            continue
        t = t.transpose(1, 2)
        if name == "g" and t.dim() == 3:
            t = t.unsqueeze(-1)
        out.append(t.detach().clone().requires_grad_(True))
    return out


CASES = list(itertools.product(["additive", "delta"], [None, "scalar", "channel"], [5, 16]))


@pytest.mark.parametrize(("rule", "gate", "C"), CASES)
@pytest.mark.parametrize("rows", [1, 4096])  # one chunk per group, and one group (per thread)
def test_matches_autograd_through_the_block_engine(rule, gate, C, rows, monkeypatch):
    monkeypatch.setattr(chunk_function, "GROUP_ROWS_PER_THREAD", rows)
    x = make_inputs(B=2, T=37, H=2, K=4, V=3, gate=gate, rule=rule, state=True)
    names = ("q", "k", "v", "beta", "g", "S0")
    ref_in, new_in = _internal(x, names), _internal(x, names)
    ref_in[-1] = x["S0"].clone().requires_grad_(True)
    new_in[-1] = x["S0"].clone().requires_grad_(True)
    o1, S1 = chunk_forward(*ref_in, C)
    o2, S2 = chunk_function.chunk_function(*new_in, C)
    torch.testing.assert_close(o2, o1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S2, S1, rtol=1e-12, atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(o1.shape, generator=gen, dtype=o1.dtype)
    d_S = torch.randn(S1.shape, generator=gen, dtype=S1.dtype)
    used = [t for t in ref_in if t is not None]
    g1 = torch.autograd.grad((o1 * d_o).sum() + (S1 * d_S).sum(), used)
    g2 = torch.autograd.grad(
        (o2 * d_o).sum() + (S2 * d_S).sum(), [t for t in new_in if t is not None]
    )
    for a, b in zip(g2, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_gradcheck_across_groups(gate, monkeypatch):
    # one chunk per group (on up to 7 threads): several groups
    monkeypatch.setattr(chunk_function, "GROUP_ROWS_PER_THREAD", 1)
    x = make_inputs(B=1, T=11, H=1, K=3, V=2, gate=gate, rule="delta", state=True)
    x["beta"] = 0.1 + 0.9 * x["beta"]
    inputs = _internal(x, ("q", "k", "v", "beta", "g"))
    inputs.append(x["S0"].clone().requires_grad_(True))
    used = [t for t in inputs if t is not None]

    def f(*tensors):
        it = iter(tensors)
        args = [None if t is None else next(it) for t in inputs]
        o, S = chunk_function.chunk_function(*args, 4, 0.7)
        return o, S

    assert torch.autograd.gradcheck(f, used, eps=1e-6, atol=1e-7)


def test_only_needed_gradients_are_computed():
    x = make_inputs(B=1, T=20, H=2, K=4, V=3, gate="scalar", rule="delta")
    q, k, v, beta, g = _internal(x, ("q", "k", "v", "beta", "g"))
    k.requires_grad_(False)
    g.requires_grad_(False)
    o, _ = chunk_function.chunk_function(q, k, v, beta, g, None, 8)
    o.sum().backward()
    assert k.grad is None and g.grad is None
    assert q.grad is not None and v.grad is not None and beta.grad is not None


@pytest.mark.parametrize("C", [1, 6, 16, 64])
def test_channel_products_equal_the_exact_decay_tensor(C):
    gen = torch.Generator().manual_seed(C)
    a, b = (torch.randn(3, C, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    G = torch.cumsum(-3 * torch.rand(3, C, 5, generator=gen, dtype=torch.float64), dim=-2)
    products = _blockmath.ChannelProducts([a, b], b, G, [False, True])
    decay = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).clamp(max=0))  # [3, C, C, 5]
    full = torch.einsum("nic,njc,nijc->nij", a, b, decay)
    torch.testing.assert_close(products.As[0], torch.tril(full), rtol=1e-12, atol=1e-12)
    exact_kk = torch.einsum("nic,njc,nijc->nij", b, b, decay)
    torch.testing.assert_close(products.As[1], torch.tril(exact_kk, -1), rtol=1e-12, atol=1e-12)


def test_unit_lower_inverse():
    gen = torch.Generator().manual_seed(0)
    L = torch.tril(0.3 * torch.randn(4, 50, 50, generator=gen, dtype=torch.float64), -1)
    A = L + torch.eye(50, dtype=torch.float64)
    X = _blockmath.unit_lower_inverse(A)
    torch.testing.assert_close(X @ A, torch.eye(50, dtype=torch.float64).expand_as(A))


def test_groups_grow_with_the_torch_threads(monkeypatch):
    monkeypatch.setattr(chunk_function, "GROUP_ROWS_PER_THREAD", 2048)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = chunk_function._chunks_per_group(64, 8)
        torch.set_num_threads(2)
        two = chunk_function._chunks_per_group(64, 8)
    finally:
        torch.set_num_threads(threads)
    assert (one, two) == (4, 8)  # 2,048 token-heads per thread: 4 chunks of 64 tokens x 8 heads
