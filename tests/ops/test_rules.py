"""The rule modules (``linattn.ops.rules``): each defines the one interface the chunk loop calls,
and the delta rule's pseudo-values are section 8's solve."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import rules
from linattn.ops.chunk import chunk_terms
from linattn.ops.mechanism import GATES, Mechanism

from .cases import make_inputs

INTERFACE = (
    "NAME",
    "READS_STATE",
    "PRODUCTS",
    "DECAYED_KEYS",
    "STACKED",
    "write",
    "entering_write",
    "pseudo_value_terms",
    "pseudo_values",
    "state_gradient_",
    "pseudo_value_backward",
)


@pytest.mark.parametrize("rule", [rules.additive, rules.delta, rules.dplr])
def test_every_rule_defines_the_interface(rule):
    missing = [name for name in INTERFACE if not hasattr(rule, name)]
    assert not missing, f"{rule.NAME} lacks {missing}"


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("rule", ["additive", "delta", "dplr"])
def test_the_mechanism_names_its_rule(rule, gate):
    assert Mechanism(rule, gate).rule is getattr(rules, rule)
    assert Mechanism(rule, gate).rule.NAME == rule


def test_a_rule_is_named_by_its_name():
    with pytest.raises(ValueError, match="rule must be one of"):
        Mechanism("deltas", "none")
    with pytest.raises(ValueError, match="gate must be one of"):
        Mechanism("delta", "scalar")


@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_delta_pseudo_values_are_the_solve_of_section_8(gate):
    # (I + L) U = diag(beta) (V - Kd S) for one chunk of 9 tokens entering with a random S, with
    # L = diag(beta) A_kk and Kd = K exp(G) (K itself without a gate).
    x = make_inputs(B=1, H=1, T=9, K=4, V=3, gate=gate, rule="delta")
    internal = [t.transpose(1, 2) for t in (x["k"], x["v"], x["beta"])]  # [B, H, T, ...]
    g = None if x["g"] is None else x["g"].transpose(1, 2)
    g = g.unsqueeze(-1) if g is not None and g.dim() == 3 else g  # [B, H, T, 1 | K]
    terms = chunk_terms(None, *internal, g, 9, Mechanism.of(x["beta"], x["g"]))
    S = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    U = rules.delta.pseudo_values(terms, S, 0)[0]
    k, v, beta = x["k"][0, :, 0], x["v"][0, :, 0], x["beta"][0, :, 0]
    G = torch.zeros(9, 1, dtype=k.dtype) if g is None else torch.cumsum(g[0, 0], dim=0)
    decay = torch.exp(G[:, None, :] - G[None, :, :])  # [i, j, 1 | K]: exp(G_i - G_j)
    A_kk = torch.tril(torch.einsum("ic,jc,ijc->ij", k, k, decay.expand(9, 9, 4)), -1)
    I_plus_L = torch.eye(9, dtype=k.dtype) + torch.diag(beta) @ A_kk
    rhs = torch.diag(beta) @ (v - (k * torch.exp(G)) @ S[0])
    torch.testing.assert_close(terms.I_plus_L[0, 0], I_plus_L, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(U, torch.linalg.solve(I_plus_L, rhs), rtol=1e-12, atol=1e-13)
