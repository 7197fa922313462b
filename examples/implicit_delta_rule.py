"""A rule that is not in the library, in one file: the implicit delta rule.

The spec (section 7.1) reads the delta rule as one explicit gradient step on the squared error
of the newest pair, S_t = S_{t-1} - beta_t grad L_t(S_{t-1}). The implicit (proximal) step takes
the gradient at the new state instead,

    S_t = argmin_S  1/2 |S - S_{t-1}|_F^2 + beta_t / 2 |S^T k_t - v_t|^2,

whose solution is the delta rule with a strength that shrinks with the key's length:

    S_t = S_{t-1} + eps_t k_t (v_t - S_{t-1}^T k_t)^T,    eps_t = beta_t / (1 + beta_t |k_t|^2).

Any beta_t >= 0 gives a contraction (eps_t |k_t|^2 < 1), so the rule needs no bound on beta.
Longhorn (Liu et al., 2024) derives its state-space model from this step and approximates it
with a diagonal; here it runs exactly. With a gate, the decay comes first as for every rule.

Run it: ``python examples/implicit_delta_rule.py`` registers the rule and a registry entry, runs
``linattn.testing.check_rule`` and prints a few rows of ``linattn accuracy``. See
docs/adding-a-mechanism.md for the walk-through.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn import registry
from linattn.ops import rule_attention, rules
from linattn.ops.rules import Input, PseudoValueTerms, Rule, read


def strength(beta: Tensor, k: Tensor) -> Tensor:
    """eps = beta / (1 + beta |k|^2), per token and value head (k broadcast over its heads)."""
    return beta / (1.0 + beta * (k * k).sum(-1))


class ImplicitDeltaRule(Rule):
    """u_t = eps_t (v_t - S^T k_t), eps_t = beta_t / (1 + beta_t |k_t|^2)."""

    NAME = "implicit_delta"
    INPUTS = (Input("beta", "1", low=0.0),)  # any strength >= 0
    PRODUCTS = (("k", True),)  # the strictly lower decayed k k^T of section 8's solve
    DECAYED_KEYS = True  # the right-hand side reads Kd = K exp(G)

    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        # S is the decayed state [..., K, V]; x_t is beta_t, one number per value head.
        return strength(x_t, k_t).unsqueeze(-1) * (v_t - read(S, k_t))

    def pseudo_value_terms(self, terms) -> PseudoValueTerms:
        # Section 8 with eps in place of beta: (I + diag(eps) A_kk) U = diag(eps) (V - Kd S),
        # so U = U0 - W S with [W | U0] = (I + L)^{-1} diag(eps) [Kd | V].
        eps = strength(terms.beta, terms.k).unsqueeze(-1)  # [n, P, C, 1]
        A_kk = terms.products.As[-1]  # [n, P, C, C], strictly lower
        eye = torch.eye(A_kk.shape[-1], dtype=A_kk.dtype, device=A_kk.device)
        rhs = eps * torch.cat([terms.Kd, terms.v], dim=-1)  # [n, P, C, K + V]
        X = torch.linalg.solve_triangular(eye + eps * A_kk, rhs, upper=False, unitriangular=True)
        K = terms.k.shape[-1]
        return PseudoValueTerms(W=X[..., :K], U0=X[..., K:])


def implicit_delta_rule(q, k, v, beta, g=None, **options):
    """The public op of the example: ``rule_attention`` with the rule's name."""
    return rule_attention("implicit_delta", q, k, v, g, beta=beta, **options)


def register() -> registry.Entry:
    """Register the rule and its mechanism (gated per key channel, as KDA); idempotent."""
    if "implicit_delta" not in rules.names():
        rules.register(ImplicitDeltaRule())
    if "implicit_delta" in registry.names():
        return registry.get("implicit_delta")
    return registry.register(
        registry.Entry(
            "implicit_delta", "implicit delta rule (per-channel decay)", "implicit_delta",
            "channel", "(I - eps_t k_t k_t^T) Diag(alpha_t)", "eps_t v_t",
            implicit_delta_rule, None, registry.rule_case("implicit_delta", "channel"),
            mixer="implicit_delta",  # LMConfig(mixers=...) builds it as linattn.layers.RuleMixer
            paper="Liu et al. (2024), the step it approximates", section="7.1",
        )
    )  # fmt: skip


if __name__ == "__main__":
    from linattn.experiments.accuracy import accuracy_markdown, compute_accuracy
    from linattn.testing import check_rule

    register()
    errors = check_rule("implicit_delta")
    print(f"check_rule: {len(errors)} checks, largest error {max(errors.values()):.1e}")
    rows = [r for r in compute_accuracy(T=200, K=8, V=8) if r["name"] == "implicit_delta"]
    print(accuracy_markdown(rows, 200, 8, 8))
