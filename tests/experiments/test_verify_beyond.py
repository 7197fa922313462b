"""``linattn verify``'s checks of MesaNet, DeltaFormer and PaTH: each passes, is run by
``linattn verify``, and fails when the property it checks is broken."""

from __future__ import annotations

import pytest

from linattn.experiments import verify


@pytest.mark.parametrize("section", ["mesa_checks", "deltaformer_checks", "path_checks"])
def test_the_checks_pass_and_are_run(section):
    checks = getattr(verify, section)()
    assert checks and all(c.passed for c in checks), [c.line() for c in checks]
    assert getattr(verify, section) in verify.SECTIONS


def test_the_mesa_check_fails_for_a_solve_that_is_not_converged(monkeypatch):
    from linattn.ops import mesa

    real = mesa.mesa_net

    def two_steps(*args, **kwargs):
        return real(*args, **{**kwargs, "max_cg_iterations": 2})

    monkeypatch.setattr(mesa, "mesa_net", two_steps)
    (check,) = verify.mesa_checks()
    assert not check.passed and check.error > 1e-6


def test_the_deltaformer_check_fails_when_beta_is_misplaced(monkeypatch):
    from linattn.ops import deltaformer

    real = deltaformer.deltaformer

    def beta_twice(q, k, v, beta, **kwargs):  # beta applied to the values once more
        return real(q, k, beta.unsqueeze(-1) * v, beta, **kwargs)

    monkeypatch.setattr(deltaformer, "deltaformer", beta_twice)
    (check,) = verify.deltaformer_checks()
    assert not check.passed and check.error > 1e-6


def test_the_path_checks_fail_for_a_transition_that_is_not_the_identity_or_a_reflection(
    monkeypatch,
):
    from linattn.ops import path

    scores, attention = path.path_scores, path.path_attention

    def half_beta(q, k, w, beta, **kwargs):  # I - w w^T: a projection, not a reflection
        return scores(q, k, w, beta / 2, **kwargs)

    def beta_plus_one(q, k, v, w, beta, *args, **kwargs):  # never the identity
        return attention(q, k, v, w, beta + 1, *args, **kwargs)

    monkeypatch.setattr(path, "path_scores", half_beta)
    monkeypatch.setattr(path, "path_attention", beta_plus_one)
    softmax, orthogonal, determinant = verify.path_checks()
    assert not softmax.passed and not orthogonal.passed and not determinant.passed
