"""The chunk loop's group form: groups of chunks, saved states, recomputed backward.

It runs through the chunk op's eager path (``library.chunk``), which takes the group loop
(``chunk.loop_forward``, ``chunk.loop_backward``) for these float64 inputs. Its outputs and
gradients must equal those of plain autograd through the all-blocks form (``chunk.chunk_forward``,
itself tested against the float64 oracle) for every gate, rule, chunk size and group size,
including chunks that do not divide T and groups of one chunk.
"""

import itertools

import pytest
import torch

from linattn.ops import _blockmath, _chunk_terms, chunk, library, tuning
from linattn.ops.chunk import chunk_forward
from linattn.ops.mechanism import Mechanism

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
# Channel gates 400 times steeper (log-decays down to about -1,600 per token): beyond the direct
# blocks' exponent budget, so the per-channel products halve (``_blockmath``).
CASES += [(rule, "steep", 16) for rule in ("additive", "delta")]


@pytest.mark.parametrize(("rule", "gate", "C"), CASES)
@pytest.mark.parametrize("rows", [1, 4096])  # one chunk per group, and one group (per thread)
def test_matches_autograd_through_the_block_engine(rule, gate, C, rows, monkeypatch):
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", rows)
    steep = gate == "steep"
    gate = "channel" if steep else gate
    x = make_inputs(B=2, T=37, H=2, K=4, V=3, gate=gate, rule=rule, state=True)
    if steep:
        x["g"] = 400 * x["g"]
        real = _blockmath.direct_block_size
        sizes = []
        monkeypatch.setattr(
            _blockmath, "direct_block_size", lambda G, *a: sizes.append(real(G, *a)) or sizes[-1]
        )
    names = ("q", "k", "v", "beta", "g", "S0")
    ref_in, new_in = _internal(x, names), _internal(x, names)
    ref_in[-1] = x["S0"].clone().requires_grad_(True)
    new_in[-1] = x["S0"].clone().requires_grad_(True)
    o1, S1 = chunk_forward(*ref_in, C, Mechanism.of(x.get("beta"), x.get("g")))
    o2, S2 = library.chunk(*new_in, C, 1.0, Mechanism.of(x.get("beta"), x.get("g")))
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
    if steep:  # the products halved (blocks smaller than the padded chunk) in some groups
        assert sizes and min(sizes) < C


@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_gradcheck_across_groups(gate, monkeypatch):
    # one chunk per group (on up to 7 threads): several groups
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", 1)
    x = make_inputs(B=1, T=11, H=1, K=3, V=2, gate=gate, rule="delta", state=True)
    x["beta"] = 0.1 + 0.9 * x["beta"]
    inputs = _internal(x, ("q", "k", "v", "beta", "g"))
    inputs.append(x["S0"].clone().requires_grad_(True))
    used = [t for t in inputs if t is not None]

    def f(*tensors):
        it = iter(tensors)
        args = [None if t is None else next(it) for t in inputs]
        o, S = library.chunk(*args, 4, 0.7, Mechanism.of(x["beta"], x.get("g")))
        return o, S

    assert torch.autograd.gradcheck(f, used, eps=1e-6, atol=1e-7)


def test_only_needed_gradients_are_computed():
    x = make_inputs(B=1, T=20, H=2, K=4, V=3, gate="scalar", rule="delta")
    q, k, v, beta, g = _internal(x, ("q", "k", "v", "beta", "g"))
    k.requires_grad_(False)
    g.requires_grad_(False)
    o, _ = library.chunk(q, k, v, beta, g, None, 8, 1.0, Mechanism("delta", "head"))
    o.sum().backward()
    assert k.grad is None and g.grad is None
    assert q.grad is not None and v.grad is not None and beta.grad is not None


def test_groups_grow_with_the_torch_threads(monkeypatch):
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", 2048)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = chunk._chunks_per_group(64, 8)
        torch.set_num_threads(2)
        two = chunk._chunks_per_group(64, 8)
    finally:
        torch.set_num_threads(threads)
    assert (one, two) == (4, 8)  # 2,048 token-heads per thread: 4 chunks of 64 tokens x 8 heads


def test_buffers_hand_the_same_memory_to_the_next_group():
    buffers = _chunk_terms.Buffers()
    like = torch.zeros(2, 3)
    first = buffers("x", like)
    assert buffers("x", like) is first  # the same name and shape: the same tensor
    assert buffers("x", like, (4, 3)).shape == (4, 3)  # the last, smaller group: a new one
    assert buffers("y", like) is not buffers("x", like)


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("gate", [None, "scalar", "channel", "steep"])
def test_reused_buffers_change_no_bit(rule, gate, monkeypatch):
    # One chunk per group: every group overwrites the previous group's terms. Outputs and
    # gradients must be bit for bit those of fresh tensors in every group ("steep": channel gates
    # beyond the direct blocks' budget, so the products halve).
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", 1)
    steep = gate == "steep"
    gate = "channel" if steep else gate
    x = make_inputs(B=2, T=37, H=2, K=4, V=3, gate=gate, rule=rule, state=True)
    if steep:
        x["g"] = 400 * x["g"]
    names = ("q", "k", "v", "beta", "g", "S0")
    results = []
    for buffers in (_chunk_terms.Buffers, lambda: _blockmath.fresh):
        monkeypatch.setattr(chunk, "Buffers", buffers)
        inputs = _internal(x, names)
        inputs[-1] = x["S0"].clone().requires_grad_(True)
        o, S = library.chunk(*inputs, 8, 1.0, Mechanism.of(x.get("beta"), x.get("g")))
        (o.square().sum() + S.sum()).backward()
        results.append([o, S] + [t.grad for t in inputs if t is not None])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
