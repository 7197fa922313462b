"""The rules (``linattn.ops.rules``): each is a ``Rule``, the one interface the chunk loop calls,
registered by its name; the delta rule's pseudo-values are section 8's solve."""

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


BUILT_IN = [rules.additive.RULE, rules.delta.RULE, rules.dplr.RULE]


@pytest.mark.parametrize("rule", BUILT_IN, ids=lambda r: r.NAME)
def test_every_rule_defines_the_interface(rule):
    assert isinstance(rule, rules.Rule)
    missing = [name for name in INTERFACE if not hasattr(rule, name)]
    assert not missing, f"{rule.NAME} lacks {missing}"
    assert rule.FUSED and rule.HAND_WRITTEN  # the built-in rules have kernels and backwards


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("rule", ["additive", "delta", "dplr"])
def test_the_mechanism_names_its_rule(rule, gate):
    assert Mechanism(rule, gate).rule is getattr(rules, rule).RULE
    assert Mechanism(rule, gate).rule.NAME == rule
    assert rules.named(rule) is getattr(rules, rule).RULE


def test_the_slots_follow_the_declared_inputs():
    assert rules.named("additive").slot_shape(4, 3) is None
    assert rules.named("delta").slot_shape(4, 3) == ()
    assert rules.named("dplr").slot_shape(4, 3) == (8,)
    ab = torch.arange(2 * 3 * 8.0).view(2, 3, 8)
    parts = rules.named("dplr").split(ab, 4, 3)
    assert list(parts) == ["a", "b"]
    torch.testing.assert_close(torch.cat([parts["a"], parts["b"]], -1), ab)
    packed = rules.named("dplr").pack(parts, torch.float32)
    torch.testing.assert_close(packed, ab)


class _Plain(rules.Rule):
    NAME = "plain_additive_copy"
    READS_STATE = False

    def write(self, S, k_t, v_t, x_t):
        return v_t

    def pseudo_value_terms(self, terms):
        return rules.PseudoValueTerms(W=None, U0=terms.v)


def test_registering_a_rule_and_refusing_a_bad_one():
    rule = rules.register(_Plain())
    try:
        assert rules.named("plain_additive_copy") is rule and not rule.HAND_WRITTEN
        assert Mechanism("plain_additive_copy", "head").rule is rule
        with pytest.raises(ValueError, match="registered already"):
            rules.register(_Plain())
    finally:
        rules.unregister("plain_additive_copy")
    with pytest.raises(ValueError, match="registered already"):
        rules.register(type("Delta", (_Plain,), {"NAME": "delta"})())
    with pytest.raises(TypeError, match="Rule subclass"):
        rules.register(rules.delta)
    with pytest.raises(ValueError, match="cannot be removed"):
        rules.unregister("delta")
    with pytest.raises(ValueError, match="an identifier"):
        rules.register(type("Bad", (_Plain,), {"NAME": "a b"})())
    with pytest.raises(ValueError, match="width must be one of"):
        rules.Input("x", "T")


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
    terms = chunk_terms(None, *internal, g, 9, Mechanism.of(x["beta"], x["g"], "delta"))
    S = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    U = rules.named("delta").pseudo_values(terms, S, 0)[0]
    k, v, beta = x["k"][0, :, 0], x["v"][0, :, 0], x["beta"][0, :, 0]
    G = torch.zeros(9, 1, dtype=k.dtype) if g is None else torch.cumsum(g[0, 0], dim=0)
    decay = torch.exp(G[:, None, :] - G[None, :, :])  # [i, j, 1 | K]: exp(G_i - G_j)
    A_kk = torch.tril(torch.einsum("ic,jc,ijc->ij", k, k, decay.expand(9, 9, 4)), -1)
    I_plus_L = torch.eye(9, dtype=k.dtype) + torch.diag(beta) @ A_kk
    rhs = torch.diag(beta) @ (v - (k * torch.exp(G)) @ S[0])
    torch.testing.assert_close(terms.own.I_plus_L[0, 0], I_plus_L, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(U, torch.linalg.solve(I_plus_L, rhs), rtol=1e-12, atol=1e-13)
