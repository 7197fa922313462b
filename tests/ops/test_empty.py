"""Empty dimensions: what PyTorch's own ops do.

B, H or T = 0: every op, form and loop returns empty outputs of the right shape, a final state of
the right shape (the initial state when T = 0: no transition ran; zeros without one), and empty
gradients of each input's shape (not None). A head without channels (K or V = 0) is refused with a
named ValueError: it has no memory and no scale 1 / sqrt(K).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from linattn.ops import (
    chunk_affine_map,
    delta_rule,
    linear_attention,
    recurrent_step,
    softmax_attention,
)

MECHANISMS = ["linear", "normalized", "scalar_decay", "gla", "delta", "gated_delta", "kda"]
FORMS = ["parallel", "recurrent", "chunk"]
EMPTY = [(0, 5, 2), (2, 5, 0), (2, 0, 2), (0, 0, 0)]  # (B, T, H)
K, V = 3, 4


def _inputs(mechanism: str, B: int, T: int, H: int, dtype, state: bool) -> dict:
    """Leaves that require grad; the state has V + 1 columns for the normalised form."""
    x = {
        "q": torch.rand(B, T, H, K, dtype=dtype),
        "k": torch.rand(B, T, H, K, dtype=dtype),
        "v": torch.randn(B, T, H, V, dtype=dtype),
    }
    if mechanism in ("delta", "gated_delta", "kda"):
        x["beta"] = torch.rand(B, T, H, dtype=dtype)
    if mechanism in ("scalar_decay", "gated_delta"):
        x["g"] = -torch.rand(B, T, H, dtype=dtype)
    if mechanism in ("gla", "kda"):
        x["g"] = -torch.rand(B, T, H, K, dtype=dtype)
    if state:
        x["initial_state"] = torch.randn(B, H, K, V + (mechanism == "normalized"), dtype=dtype)
    return {n: t.requires_grad_(True) for n, t in x.items()}


def _run(mechanism: str, x: dict, mode: str):
    if "beta" in x:
        args = {n: t for n, t in x.items() if n not in ("q", "k", "v", "beta")}
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], mode=mode, chunk_size=2,
                          output_final_state=True, **args)  # fmt: skip
    args = {n: t for n, t in x.items() if n not in ("q", "k", "v")}
    return linear_attention(x["q"], x["k"], x["v"], mode=mode, chunk_size=2,
                            normalize=mechanism == "normalized", output_final_state=True,
                            **args)  # fmt: skip


# (form, LINATTN_NATIVE): the chunk form with its fused C++ loop and with its PyTorch loop.
RUNS = [("parallel", "1"), ("recurrent", "1"), ("chunk", "1"), ("chunk", "0")]
CASES = list(itertools.product(MECHANISMS, RUNS, EMPTY, [False, True]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("mechanism", "run", "sizes", "state"), CASES)
def test_empty_inputs_give_empty_outputs_and_gradients(
    mechanism, run, sizes, state, dtype, monkeypatch
):
    mode, native = run
    monkeypatch.setenv("LINATTN_NATIVE", native)
    B, T, H = sizes
    x = _inputs(mechanism, B, T, H, dtype, state)
    o, S = _run(mechanism, x, mode)
    Vs = V + (mechanism == "normalized")
    assert o.shape == (B, T, H, V) and o.dtype == dtype
    assert S.shape == (B, H, K, Vs)
    if state:
        assert torch.equal(S, x["initial_state"])  # T = 0 or no sequence: S_T = S_0
    else:
        assert torch.equal(S, torch.zeros(B, H, K, Vs, dtype=S.dtype))
    d_S = torch.randn(S.shape, dtype=S.dtype)
    (o.sum() + (S * d_S).sum()).backward()
    for name, t in x.items():
        assert t.grad is not None and t.grad.shape == t.shape, name
    if state:
        torch.testing.assert_close(x["initial_state"].grad, d_S.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("mode", FORMS)
def test_packed_sequences_without_heads(mode):
    x = _inputs("kda", 1, 5, 0, torch.float32, True)
    x["initial_state"] = torch.zeros(2, 0, K, V, requires_grad=True)
    o, S = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], mode=mode, chunk_size=2,
                      initial_state=x["initial_state"], output_final_state=True,
                      cu_seqlens=torch.tensor([0, 2, 5]))  # fmt: skip
    assert o.shape == (1, 5, 0, V) and S.shape == (2, 0, K, V)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("B", "T_q", "T_k", "H"), [(0, 3, 3, 2), (2, 3, 3, 0), (2, 0, 0, 2),
                                                    (2, 0, 4, 2)])  # fmt: skip
def test_softmax_attention_empty(B, T_q, T_k, H, fused):
    q = torch.randn(B, T_q, H, K, requires_grad=True)
    k = torch.randn(B, T_k, H, K, requires_grad=True)
    v = torch.randn(B, T_k, H, V, requires_grad=True)
    o = softmax_attention(q, k, v, fused=fused)
    assert o.shape == (B, T_q, H, V)
    o.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v))


def test_softmax_over_no_keys_is_refused():
    q, k = torch.randn(1, 2, 1, K), torch.randn(1, 0, 1, K)
    with pytest.raises(ValueError, match="k needs at least one token"):
        softmax_attention(q, k, torch.randn(1, 0, 1, V), causal=False)


@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("sizes", EMPTY)
def test_affine_map_of_empty_blocks(sizes, gate):
    B, T, H = sizes
    k = torch.randn(B, T, H, K, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, T, H, V, dtype=torch.float64, requires_grad=True)
    beta = torch.rand(B, T, H, dtype=torch.float64, requires_grad=True)
    g = {None: None, "scalar": -torch.rand(B, T, H), "channel": -torch.rand(B, T, H, K)}[gate]
    g = None if g is None else g.double().requires_grad_(True)
    for b in (None, beta):
        M, N = chunk_affine_map(k, v, b, g)
        assert M.shape == (B, H, K, K) and N.shape == (B, H, K, V)
        # No token: the identity map (M = I, N = 0), the composition's neutral element.
        assert torch.equal(M, torch.eye(K, dtype=M.dtype).expand(B, H, K, K))
        assert torch.equal(N, torch.zeros(B, H, K, V, dtype=N.dtype))
        (M.sum() + N.sum()).backward()
        used = [t for t in (k, v, b, g) if t is not None]
        assert all(t.grad is not None and t.grad.shape == t.shape for t in used)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("B", "H"), [(0, 2), (2, 0)])
@pytest.mark.parametrize("grad", [False, True])
def test_step_without_batch_or_heads(B, H, dtype, grad):
    state = torch.zeros(B, H, K, V, dtype=dtype)
    x = {
        "q": torch.randn(B, H, K, dtype=dtype),
        "k": torch.randn(B, H, K, dtype=dtype),
        "v": torch.randn(B, H, V, dtype=dtype),
        "beta": torch.rand(B, H, dtype=dtype),
        "g": -torch.rand(B, H, K, dtype=dtype),
    }
    for t in x.values():
        t.requires_grad_(grad)
    o = recurrent_step(state, **x)
    assert o.shape == (B, H, V) and state.shape == (B, H, K, V)
    if grad:
        o.sum().backward()
        assert all(t.grad is not None and t.grad.shape == t.shape for t in x.values())


def _zero_channel_calls(K0: int, V0: int):
    q, k = torch.randn(1, 3, 1, K0), torch.randn(1, 3, 1, K0)
    v, beta = torch.randn(1, 3, 1, V0), torch.rand(1, 3, 1)
    return [
        lambda: linear_attention(q, k, v),
        lambda: delta_rule(q, k, v, beta),
        lambda: softmax_attention(q, k, v),
        lambda: chunk_affine_map(k, v, beta),
        lambda: recurrent_step(torch.zeros(1, 1, K0, V0), q[:, 0], k[:, 0], v[:, 0]),
    ]


@pytest.mark.parametrize(("K0", "V0"), [(0, 4), (3, 0)])
@pytest.mark.parametrize("call", range(5))
def test_heads_without_channels_are_refused(K0, V0, call):
    with pytest.raises(ValueError, match=r"must have head sizes K >= 1 and V >= 1"):
        _zero_channel_calls(K0, V0)[call]()
