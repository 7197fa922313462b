"""Update rules, one module each: what a mechanism's memory writes (docs/design.md, "Rules are
modules").

Every mechanism of the mechanism table (docs/design.md) is ``S_t = A_t S_{t-1} + k_t w_t^T``,
read as
``o_t = S_t^T q_t``. Its gate (none, one log-decay per head, one per key channel) is the diagonal
part of A_t and is handled alike for every rule (the cumulative log-gates of ``_chunk_terms``);
the rule is the rest: how a token's write reads the state, and so how a chunk's pseudo-values U
(what the chunk writes, ``S <- D S + Ke^T U``) come from its values. A rule module defines, in the
spec's names:

    write(S, k_t, v_t, beta_t) -> u_t         the step: one token's write, read from the decayed
                                              state S (``recurrent.step`` adds k_t u_t^T)
    entering_write(S, beta_t)                 the step's write that reads the state entering the
                                              token, before its decay: (a_t, b_t^T S) of the
                                              generalized rule, None for the others
    READS_STATE                               whether a chunk's U depends on the state entering it
    PRODUCTS                                  the decayed causal products the rule needs besides
                                              A_qk: (left factor's name, strictly causal) pairs,
                                              each times k on the right (``_chunk_terms.Products``)
    DECAYED_KEYS                              whether it reads Kd = K exp(G) (``terms.Kd``)
    pseudo_value_terms(terms)                 the state-independent terms W, U0 of every chunk
                                              (U = U0 - W S), set on ``terms``
    pseudo_values(terms, S, j=None, out=None) U of chunk j entering with S (or of every chunk)
    state_gradient_(terms, j, dU_j, dS_j)     dS_j += (dU_j / dS_j)^T dU_j, in place
    pseudo_value_backward(terms, dU, S)       (dv, dbeta, dKd, [dA of each of PRODUCTS])
    STACKED                                   whether the chunk writes along stacked directions
                                              (dplr); such a rule also defines
    gradients(terms, dQd, dA_q, dKe, dD, dU, S)   (dq, dk, dv, dbeta, dg): ``Terms.gradients``
                                              for its stacked terms

The chunk loop (``chunk``) and the terms (``_chunk_terms``) call these and nothing else of a rule:
a new rule is a new module here, ``Mechanism.rule`` naming it (``named``). A rule whose chunk
writes along more vectors than its keys (the diagonal-plus-low-rank transition, ``dplr``,
whose chunk writes Ke^T V + Ae^T U_b) stacks them along the chunk's token axis in its
``pseudo_value_terms`` (Ke = [Ke; Ae], U = [V; U_b], A_qk = [A_qk, A_qa]), so that the loop's
three steps, and their gradient, stay as they are; its own inputs ab = [a | b] travel where beta
does.

| rule     | write u_t                 | pseudo-values U of a chunk (section 8)              |
|----------|---------------------------|-----------------------------------------------------|
| additive | v_t                       | V                                                   |
| delta    | beta_t (v_t - S^T k_t)    | (I + L)^{-1} diag(beta) (V - Kd S) = U0 - W S       |
| dplr     | v_t, and a_t along b_t^T S_{t-1} | [V; U_b], (I - A_ba) U_b = A_bk V + Bd S     |
"""

from __future__ import annotations

from types import ModuleType

from linattn.ops.rules import additive, delta, dplr
from linattn.ops.rules.base import read

__all__ = ["additive", "delta", "dplr", "named", "read"]

_MODULES = {module.NAME: module for module in (additive, delta, dplr)}


def named(name: str) -> ModuleType:
    """The rule module of that name: "additive", "delta" or "dplr"."""
    try:
        return _MODULES[name]
    except KeyError:
        raise ValueError(f"rule must be one of {tuple(_MODULES)}, got {name!r}") from None
