"""linattn.testing.check_rule: the built-in rules pass it, and it catches a wrong rule."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import rules
from linattn.ops.rules import Input, PseudoValueTerms, Rule, read
from linattn.testing import check_rule, make_inputs, oracle


@pytest.mark.parametrize("name", ["additive", "delta", "dplr"])
def test_the_built_in_rules_pass(name):
    errors = check_rule(name, seeds=(0,))
    assert max(errors.values()) < 1e-12
    assert "gradcheck" in errors and any(key.startswith("packed") for key in errors)


class _Halved(Rule):
    """The delta rule whose chunk terms use beta / 2 while its step uses beta: a wrong rule."""

    NAME = "halved_delta_for_test"
    INPUTS = (Input("beta", "1", 0.0, 2.0),)
    PRODUCTS = (("k", True),)
    DECAYED_KEYS = True

    def write(self, S, k_t, v_t, x_t):
        return x_t.unsqueeze(-1) * (v_t - read(S, k_t))

    def pseudo_value_terms(self, terms):
        b = 0.5 * terms.beta.unsqueeze(-1)
        A = terms.products.As[-1]
        eye = torch.eye(A.shape[-1], dtype=A.dtype)
        X = torch.linalg.solve_triangular(
            eye + b * A, b * torch.cat([terms.Kd, terms.v], -1), upper=False, unitriangular=True
        )
        K = terms.k.shape[-1]
        return PseudoValueTerms(W=X[..., :K], U0=X[..., K:])


def test_a_rule_whose_chunk_form_disagrees_with_its_step_fails():
    rules.register(_Halved())
    try:
        with pytest.raises(AssertionError, match="parallel output, gate none"):
            check_rule("halved_delta_for_test", seeds=(0,))
    finally:
        rules.unregister("halved_delta_for_test")


def test_the_oracle_is_the_delta_rule_for_the_delta_rule():
    from linattn.reference.gated import recurrence

    rule = rules.named("delta")
    x = make_inputs(rule, 1, 9, 1, 4, 3, "head", seed=2)
    O, S = oracle(rule, x, 0.5)
    want, S_want = recurrence(
        *(x[n][0, :, 0].numpy() for n in ("q", "k", "v", "beta", "g")),
        rule="delta", scale=0.5, initial_state=x["S0"][0, 0].numpy(),
    )  # fmt: skip
    torch.testing.assert_close(O[0, :, 0], torch.from_numpy(want), rtol=0, atol=1e-13)
    torch.testing.assert_close(S[0, 0], torch.from_numpy(S_want), rtol=0, atol=1e-13)


def test_inputs_lie_in_the_declared_ranges():
    class Ranged(_Halved):
        INPUTS = (Input("lo", "1", low=1.0), Input("hi", "K", high=-1.0), Input("u", "V"))

    x = make_inputs(Ranged(), 2, 50, 2, 4, 3, "channel")
    assert bool((x["lo"] >= 1).all()) and bool((x["hi"] <= -1).all())
    assert x["hi"].shape == (2, 50, 2, 4) and x["u"].shape == (2, 50, 2, 3)
    assert bool((x["g"] < 0).all())
