"""compat's ``chunk_log_linear_attn`` vs fla 0.6.0: its naive reference (``naive.py``, float64)
and its Triton kernel under the interpreter (float32, K = 64 as the kernel needs): one token, T
not a multiple of its chunk of 64, packed sequences with a length-1 piece, its final state
(``LogLinearAttentionState``) and a call continued from it, both ways."""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
fla_chunk = pytest.importorskip("fla.ops.log_linear_attn.chunk")
naive = pytest.importorskip("fla.ops.log_linear_attn.naive")

from linattn import compat  # noqa: E402
from linattn.compat.log_linear_attn import LogLinearAttentionState  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


@pytest.fixture(autouse=True)
def boolean_masks(monkeypatch):
    """fla's kernel ands a mask with a constexpr comparison (``m_t[:, None] & (7 < L)``): an
    int32 mask, which triton 3.9's interpreter refuses and compiled triton reads as a boolean
    (tests/fla_interpreter.py)."""
    fla_interpreter.boolean_masks(monkeypatch)


def draws(B=1, T=70, G=1, H=2, K=64, V=8, L=9, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    k = torch.nn.functional.normalize(rn(B, T, G, K), dim=-1)
    g = torch.nn.functional.logsigmoid(rn(B, T, H) + 3)
    lam = torch.rand(B, T, H, L, generator=gen, dtype=torch.float64)
    return [x.to(dtype) for x in (rn(B, T, G, K), k, rn(B, T, H, V), g, lam)]


def assert_states(ours, theirs, atol):
    assert isinstance(ours, LogLinearAttentionState)
    for name in ("ht", "offsets", "q_prev", "k_prev", "v_prev", "g_prev", "level_scales_prev"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("scale", [1.0, None])
def test_equals_fla_s_naive_reference_in_float64(scale):
    q, k, v, g, lam = draws(T=37, K=8, V=4, L=7, dtype=torch.float64)  # naive needs L >= 7
    o, state = compat.chunk_log_linear_attn(q, k, v, g, lam, scale=scale)
    assert state is None
    torch.testing.assert_close(o, naive.naive_log_linear_attn(q, k, v, g, lam, scale=scale),
                               rtol=0, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("T", [1, 70])
def test_equals_fla_s_kernel_with_its_final_state(T):
    x = draws(T=T)
    o_fla, s_fla = fla_chunk.chunk_log_linear_attn(*x, output_final_state=True)
    o, s = compat.chunk_log_linear_attn(*x, output_final_state=True)
    torch.testing.assert_close(o, o_fla, rtol=0, atol=2e-5)
    assert_states(s, s_fla, atol=2e-5)


def test_packed_sequences_with_a_length_one_piece_and_continued_states():
    q, k, v, g, lam = draws(T=80)
    cu = torch.tensor([0, 1, 80])
    o_fla, s_fla = fla_chunk.chunk_log_linear_attn(q, k, v, g, lam, output_final_state=True,
                                                   cu_seqlens=cu)  # fmt: skip
    o, s = compat.chunk_log_linear_attn(q, k, v, g, lam, output_final_state=True, cu_seqlens=cu)
    torch.testing.assert_close(o, o_fla, rtol=0, atol=2e-5)
    assert_states(s, s_fla, atol=2e-5)
    # Continued: 10 more tokens per sequence, from fla's state (fla) and from ours (compat).
    x2 = draws(T=20, seed=1)
    cu2 = torch.tensor([0, 10, 20])
    o2_fla, s2_fla = fla_chunk.chunk_log_linear_attn(
        *x2, initial_state=s_fla, output_final_state=True, cu_seqlens=cu2
    )
    o2, s2 = compat.chunk_log_linear_attn(*x2, initial_state=s, output_final_state=True,
                                          cu_seqlens=cu2)  # fmt: skip
    torch.testing.assert_close(o2, o2_fla, rtol=0, atol=2e-5)
    assert_states(s2, s2_fla, atol=2e-5)
    # fla's own state object is accepted as it is.
    o3, _ = compat.chunk_log_linear_attn(*x2, initial_state=s_fla, cu_seqlens=cu2)
    torch.testing.assert_close(o3, o2_fla, rtol=0, atol=2e-5)


def test_a_continued_batch_equals_the_whole_sequence_in_float64():
    q, k, v, g, lam = draws(B=2, T=150, K=4, V=3, dtype=torch.float64)
    whole, s_whole = compat.chunk_log_linear_attn(q, k, v, g, lam, output_final_state=True)
    first, s = compat.chunk_log_linear_attn(*(t[:, :70] for t in (q, k, v, g, lam)),
                                            output_final_state=True)  # fmt: skip
    rest, s2 = compat.chunk_log_linear_attn(*(t[:, 70:] for t in (q, k, v, g, lam)),
                                            initial_state=s, output_final_state=True)  # fmt: skip
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-12)
    assert_states(s2, s_whole, atol=1e-12)


def test_gradients_flow_to_every_input():
    leaves = [t.requires_grad_(True) for t in draws(T=20, K=4, V=3, dtype=torch.float64)]
    o, _ = compat.chunk_log_linear_attn(*leaves)
    o.square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in leaves)


def test_bad_input_is_named():
    q, k, v, g, lam = draws(T=5, K=4, V=3)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        compat.chunk_log_linear_attn(*draws(B=2, T=5, K=4, V=3), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="level_scales must have shape"):
        compat.chunk_log_linear_attn(q, k, v, g, lam[:, :3])
    with pytest.raises(TypeError, match="initial_state must be a LogLinearAttentionState"):
        compat.chunk_log_linear_attn(q, k, v, g, lam, initial_state=torch.zeros(1, 2, 4, 3))
    with pytest.raises(ValueError, match="v must have shape"):
        compat.chunk_log_linear_attn(q, k, v[:, :4], g, lam)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, H\]"):
        compat.chunk_log_linear_attn(q, k, v, g[:, :, :1], lam)
    with pytest.raises(ValueError, match="g is a log-decay"):
        compat.chunk_log_linear_attn(q, k, v, -g, lam)
    state = LogLinearAttentionState(*(torch.zeros(1) for _ in range(7)))
    with pytest.raises(ValueError, match=r"initial_state.q_prev must have shape"):
        compat.chunk_log_linear_attn(q, k, v, g, lam, initial_state=state)
