"""The float64 oracle for every gated and delta-rule op: the mechanism table, taken literally
(docs/design.md, "The mechanism table").

One memory ``S_t`` (K x V) for one head, updated as ``S_t = A_t S_{t-1} + k_t w_t^T`` and read as
``o_t = S_t^T (scale q_t)``:

    rule        g          transition A_t                          write w_t
    additive    None       I                                       v_t
    additive    [T]        alpha_t I                               v_t
    additive    [T, K]     Diag(alpha_t)                           v_t
    delta       None       I - beta_t k_t k_t^T                    beta_t v_t
    delta       [T]        alpha_t (I - beta_t k_t k_t^T)          beta_t v_t
    delta       [T, K]     (I - beta_t k_t k_t^T) Diag(alpha_t)    beta_t v_t

with ``alpha_t = exp(g_t)`` (spec sections 4, 5, 7, 8 and 10). Every transition is built as a full
K x K matrix on purpose: this is the slow, obviously right definition that the fast forms are tested
against.
"""

from __future__ import annotations

import numpy as np


def _decay(dim: int, g_t) -> np.ndarray:
    """Diag(alpha_t): I without a gate, alpha_t I for one gate per head, Diag(alpha_t) per key."""
    if g_t is None:
        return np.eye(dim)
    alpha = np.exp(np.asarray(g_t, dtype=np.float64))
    return alpha * np.eye(dim) if alpha.ndim == 0 else np.diag(alpha)


# The table's two columns per rule, literally: A_t from (k_t, beta_t, the decay) and w_t from
# (v_t, beta_t). The delta rule's decay is applied first: (I - beta k k^T) acts on the decayed
# state.
TRANSITIONS = {
    "additive": lambda k_t, beta_t, decay: decay,
    "delta": lambda k_t, beta_t, decay: (np.eye(len(k_t)) - beta_t * np.outer(k_t, k_t)) @ decay,
}
WRITES = {
    "additive": lambda v_t, beta_t: v_t,
    "delta": lambda v_t, beta_t: beta_t * v_t,
}

NEEDS_BETA = frozenset({"delta"})


def _known(rule: str) -> None:
    if rule not in TRANSITIONS:
        raise ValueError(f"rule must be one of {sorted(TRANSITIONS)}, got {rule!r}")


def transition(k_t, beta_t=None, g_t=None, *, rule="additive"):
    """The K x K matrix A_t of one step (the table in the module docstring)."""
    _known(rule)
    k_t = np.asarray(k_t, dtype=np.float64)
    return TRANSITIONS[rule](k_t, beta_t, _decay(k_t.shape[0], g_t))


def write(v_t, beta_t=None, *, rule="additive"):
    """The write w_t of one step: v_t (additive rule) or beta_t v_t (delta rule)."""
    _known(rule)
    return WRITES[rule](np.asarray(v_t, dtype=np.float64), beta_t)


def recurrence(q, k, v, beta=None, g=None, *, rule="additive", scale=1.0, initial_state=None):
    """Run S_t = A_t S_{t-1} + k_t w_t^T, o_t = S_t^T (scale q_t) for one head; return (O, S_T).

    q, k: [T, K]; v: [T, V]; beta: [T] (delta rule only); g: None, [T] or [T, K] (log-decay);
    initial_state: [K, V] or None (zeros). Returns O [T, V] and the final state [K, V], float64.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _known(rule)
    if beta is None and rule in NEEDS_BETA:
        raise ValueError(f"beta is required for rule={rule!r}")
    S = np.zeros((k.shape[1], v.shape[1]))
    if initial_state is not None:
        S = np.array(initial_state, dtype=np.float64)
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        beta_t = None if beta is None else float(beta[t])
        g_t = None if g is None else g[t]
        A = transition(k[t], beta_t, g_t, rule=rule)
        S = A @ S + np.outer(k[t], write(v[t], beta_t, rule=rule))
        out[t] = S.T @ (scale * q[t])
    return out, S


def delta_product(q, k, v, beta, g=None, *, num_householder, scale=1.0, initial_state=None):
    """Gated DeltaProduct for one head: per token t, S_t = A_t S_{t-1} + N_t with

        A_t = H_tn ... H_t1 alpha_t,   H_tj = I - beta_tj k_tj k_tj^T,

    the n_h writes folded in order (S <- H_tj S + beta_tj k_tj v_tj^T), o_t = S_t^T (scale q_t).

    q: [T, K]; k: [T n_h, K]; v: [T n_h, V]; beta: [T n_h] (the writes of token t are rows
    t n_h .. t n_h + n_h - 1); g: None, [T] or [T, K]. Returns O [T, V] and S_T [K, V], float64.
    """
    n = int(num_householder)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    S = np.zeros((k.shape[1], v.shape[1]))
    if initial_state is not None:
        S = np.array(initial_state, dtype=np.float64)
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        if g is not None:
            S = transition(k[0], g_t=g[t], rule="additive") @ S  # alpha_t I or Diag(alpha_t)
        for r in range(t * n, t * n + n):
            A = transition(k[r], float(beta[r]), rule="delta")  # I - beta k k^T
            S = A @ S + np.outer(k[r], write(v[r], float(beta[r]), rule="delta"))
        out[t] = S.T @ (scale * q[t])
    return out, S
