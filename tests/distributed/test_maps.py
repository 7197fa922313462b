"""A slice's affine map (M, N): agrees with ``ops.chunk_affine_map`` and with the op's own state."""

from __future__ import annotations

import math

import pytest
import torch

from linattn import ops
from linattn.distributed import maps
from linattn.ops.mechanism import Mechanism

from ..ops.cases import oracle, rel_rms
from ..ops.reset_cases import reset_inputs
from .cp_worker import CASES, make_case

# (name, delta rule?); the user rule's maps are checked by linattn.testing.check_rule
NAMES = [
    (name, rule == "delta")
    for name, fn, rule, _, normalize in CASES
    if not normalize and fn != "rule_attention"
]


def slice_map(x: dict, delta: bool, chunk_size: int = 4):
    beta = x["beta"] if delta else None
    mech = Mechanism.of(beta, x["g"])
    return maps.slice_map(x["k"], x["v"], beta, x["g"], mech, chunk_size=chunk_size)


def full_matrix(M: torch.Tensor | None, K: int) -> torch.Tensor:
    """A stored M (None, diagonal [.., 1|K, 1] or full) as the [B, H, K, K] matrix."""
    eye = torch.eye(K, dtype=torch.float64)
    if M is None:
        return eye
    if M.shape[-1] == 1 and K > 1:
        return M * eye  # the diagonal times I
    return M


@pytest.mark.parametrize("name, delta", NAMES)
def test_map_equals_chunk_affine_map(name, delta):
    x = make_case(name, 13, torch.float64)["inputs"]
    M, N = slice_map(x, delta)
    M_ref, N_ref = ops.chunk_affine_map(x["k"], x["v"], x["beta"], x["g"])
    K = x["k"].shape[-1]
    torch.testing.assert_close(full_matrix(M, K).expand_as(M_ref), M_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(N, N_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, delta", NAMES)
def test_map_moves_any_state_like_the_op(name, delta):
    """M S + N is the op's final state from S, for a slice of many chunks (T = 203, C = 8)."""
    x = make_case(name, 203, torch.float64)["inputs"]
    M, N = slice_map(x, delta, chunk_size=8)
    S = x["S0"]
    if delta:
        _, S_out = ops.delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], initial_state=S,
                                  output_final_state=True)  # fmt: skip
    else:
        _, S_out = ops.linear_attention(x["q"], x["k"], x["v"], x["g"], initial_state=S,
                                        output_final_state=True)  # fmt: skip
    torch.testing.assert_close(maps.apply(M, N, S), S_out, rtol=0, atol=1e-10)


def test_stored_forms():
    x = make_case("gla", 5, torch.float64)["inputs"]
    assert slice_map(x, False)[0].shape == (2, 2, 4, 1)
    assert slice_map({**x, "g": x["g"][..., 0]}, False)[0].shape == (2, 2, 1, 1)
    assert slice_map({**x, "g": None}, False)[0] is None
    assert slice_map({**x, "beta": torch.rand(x["k"].shape[:3], dtype=torch.float64)}, True)[
        0
    ].shape == (2, 2, 4, 4)
    assert Mechanism.of(None, x["g"]) == Mechanism("additive", "channel")


@pytest.mark.parametrize("reset", [-1e7, -math.inf])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("delta", [False, True])
def test_maps_with_resets(delta, gate, reset):
    """Resets inside a slice: in float32 M S0 + N is the float64 recurrence's state,
    and the gradients of k, v, beta, g through the map are float64's to float32 rounding."""
    rule = "delta" if delta else "additive"
    x = reset_inputs(rule, gate, reset)
    x["g"][:, -1] = -0.05  # not at the last token, where the state (and so M, N) starts afresh
    _, S_ref = oracle(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")), rule=rule)
    names = [n for n in ("k", "v", "beta", "g") if x[n] is not None]
    grads = {}
    for dtype in (torch.float32, torch.float64):
        leaves = {n: x[n].to(dtype, copy=True).requires_grad_() for n in names}
        M, N = slice_map({"beta": None, **leaves}, delta, chunk_size=7)
        S = maps.apply(M, N, x["S0"].to(dtype))
        assert torch.isfinite(S).all()
        assert rel_rms(S.detach(), S_ref) <= (2e-6 if dtype == torch.float32 else 1e-10)
        weights = torch.randn(S.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        grads[dtype] = torch.autograd.grad((S * weights).sum(), [leaves[n] for n in names])
    for n, a, b in zip(names, *grads.values(), strict=True):
        assert torch.isfinite(a).all() and rel_rms(a, b) <= 2e-6, n
