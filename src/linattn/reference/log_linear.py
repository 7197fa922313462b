"""Log-linear attention, taken literally (Guo, Yang et al. 2025, "Log-Linear Attention").

The prefix of token t is partitioned by a Fenwick tree: token s <= t belongs to level

    l(t, s) = 0                          if s = t
            = 1 + floor(log2(t XOR s))   if s < t   (the highest bit where t and s differ)

so that t sees at most 1 + ceil(log2(t + 1)) levels (paper, section 3.1: "Fenwick tree
partitioning"). Each level has a weight per token, lambda_t^(l) (``level_scales[t, l]``); a level
l >= L (the number of weights given) weighs 0. Over Mamba-2's memory (one log-decay g_t per head,
the additive rule) the output is the masked product (paper, section 3.2, eq. "O = (Q K^T (.) M^S
(.) M^H) V"):

    O = (scale Q K^T (.) M^S (.) M^H) V,
    M^S[t, s] = exp(g_{s+1} + ... + g_t)  (s <= t),    M^H[t, s] = lambda_t^(l(t, s))  (s <= t).

``masked_product`` is that formula. ``recurrence`` is the same output from O(log T) states
(paper, section 3.2, "recurrent form"): with the states S^(1), S^(2), ... holding the prefix
levels of the next token (level l holds the tokens s with l(t, s) = l, decayed to t - 1), a token

    decays every level:   S^(l) <- exp(g_t) S^(l)
    reads:                o_t = scale (lambda_t^(0) (q_t . k_t) v_t + sum_l lambda_t^(l) S^(l)T q_t)
    merges (Fenwick):     z = the trailing ones of t;  S^(z+1) <- k_t v_t^T + S^(1) + ... + S^(z),
                          S^(1) = ... = S^(z) = 0

(t + 1 differs from every token of levels 1 .. z and from t itself first at bit z). Level l
is occupied exactly when bit l - 1 of the next position is set. Positions count from ``offset``
(the tokens seen before, whose levels are ``initial_state``), so a sequence can be continued.

Over Gated DeltaNet's memory (``beta`` given: the delta rule with a decay per head) the paper
(section 3.4) keeps the hierarchical mask on the read and Gated DeltaNet's pseudo-values:

    O = (scale Q K^T (.) M^S (.) M^H) U,
    (I + tril(diag(beta) (K K^T (.) M^S), -1)) U = diag(beta) V

so U is the plain Gated DeltaNet's (its writes read the whole state, every level), and the level
states hold k_s u_s^T: a token decays every level, reads u_t = beta_t (v_t - S^T k_t) with S the
sum of the occupied levels, and the rest is the loop above with u_t in place of v_t.
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, same_rows, same_shape


def level(t: int, s: int) -> int:
    """The Fenwick level of the pair (t, s), s <= t: 0 on the diagonal, else the index of the
    highest bit where t and s differ, plus one (paper, section 3.1)."""
    if not 0 <= s <= t:
        raise ValueError(f"level needs 0 <= s <= t, got t={t}, s={s}")
    return (t ^ s).bit_length()


def _inputs(q, k, v, g, level_scales, scale):
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_shape(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    T = q.shape[0]
    g = np.zeros(T) if g is None else np.asarray(g, dtype=np.float64)
    if g.shape != (T,):
        raise ValueError(f"g must have shape [T] = {(T,)}, got {g.shape}")
    lam = as_matrix("level_scales", level_scales)
    if lam.shape[0] != T:
        raise ValueError(f"level_scales must have shape [T, L] with T = {T}, got {lam.shape}")
    return q, k, v, g, lam, as_real("scale", scale)


def _weight(lam: np.ndarray, t: int, lvl: int) -> float:
    """lambda_t^(lvl); 0 for a level beyond the L weights given."""
    return lam[t, lvl] if lvl < lam.shape[1] else 0.0


def hierarchical_mask(level_scales, offset: int = 0) -> np.ndarray:
    """M^H [T, T]: M^H[t, s] = lambda_t^(l(offset + t, offset + s)) for s <= t, else 0."""
    lam = as_matrix("level_scales", level_scales)
    T = lam.shape[0]
    M = np.zeros((T, T))
    for t in range(T):
        for s in range(t + 1):
            M[t, s] = _weight(lam, t, level(offset + t, offset + s))
    return M


def decay_mask(g) -> np.ndarray:
    """M^S [T, T]: exp(g_{s+1} + ... + g_t) for s <= t, else 0 (Mamba-2's mask)."""
    g = np.asarray(g, dtype=np.float64)
    T = g.shape[0]
    M = np.zeros((T, T))
    for t in range(T):
        for s in range(t + 1):
            M[t, s] = np.exp(g[s + 1 : t + 1].sum())
    return M


def _beta(beta, T: int) -> np.ndarray | None:
    if beta is None:
        return None
    beta = np.asarray(beta, dtype=np.float64)
    if beta.shape != (T,):
        raise ValueError(f"beta must have shape [T] = {(T,)}, got {beta.shape}")
    return beta


def pseudo_values(k, v, g, beta) -> np.ndarray:
    """Gated DeltaNet's U [T, V]: (I + tril(diag(beta) (K K^T (.) M^S), -1)) U = diag(beta) V."""
    k, v = as_matrix("k", k), as_matrix("v", v)
    beta = _beta(beta, k.shape[0])
    g = np.zeros(k.shape[0]) if g is None else np.asarray(g, dtype=np.float64)
    A = np.tril(beta[:, None] * (k @ k.T) * decay_mask(g), -1)
    return np.linalg.solve(np.eye(k.shape[0]) + A, beta[:, None] * v)


def masked_product(
    q, k, v, g, level_scales, *, scale=1.0, offset: int = 0, beta=None
) -> np.ndarray:
    """O = (scale Q K^T (.) M^S (.) M^H) V for one head, float64 (paper, section 3.2); with
    ``beta`` [T], Gated DeltaNet's: V replaced by its pseudo-values U (section 3.4).

    q, k: [T, K]; v: [T, V]; g: [T] log-decays (None: no decay); level_scales: [T, L];
    ``offset``: the position of the first token (its levels are those of offset + t).
    """
    q, k, v, g, lam, scale = _inputs(q, k, v, g, level_scales, scale)
    if beta is not None:
        v = pseudo_values(k, v, g, beta)
    return (scale * (q @ k.T) * decay_mask(g) * hierarchical_mask(lam, offset)) @ v


def recurrence(
    q, k, v, g, level_scales, *, scale=1.0, initial_state=None, offset: int = 0, beta=None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The token loop over the O(log T) level states for one head (the module docstring);
    returns (O [T, V], the level states [S^(1), S^(2), ...] of the position offset + T).

    ``initial_state``: the level states at position ``offset`` (a list or an array [n, K, V];
    state l - 1 is level l), each decayed to the token before. The states returned are
    max(n, L - 1, bit_length(offset + T)) long: every level a token can still read.
    ``beta`` [T]: Gated DeltaNet's memory (the token writes u_t = beta_t (v_t - S^T k_t), S the
    sum of the occupied levels after the decay).
    """
    q, k, v, g, lam, scale = _inputs(q, k, v, g, level_scales, scale)
    T, K = q.shape
    V = v.shape[1]
    if int(offset) != offset or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset}")
    states = [] if initial_state is None else [np.array(S, dtype=np.float64) for S in initial_state]
    for S in states:
        if S.shape != (K, V):
            raise ValueError(f"initial_state must hold [K, V] = {(K, V)} states, got {S.shape}")
    n = max(len(states), lam.shape[1] - 1, (offset + T).bit_length())
    states += [np.zeros((K, V)) for _ in range(n - len(states))]
    beta = _beta(beta, T)
    out = np.empty((T, V))
    for i in range(T):
        t = offset + i
        states = [np.exp(g[i]) * S for S in states]
        u = v[i]
        if beta is not None:  # the delta rule reads the whole (decayed) state: every level
            whole = sum((S for j, S in enumerate(states) if (t >> j) & 1), np.zeros((K, V)))
            u = beta[i] * (v[i] - whole.T @ k[i])
        o = _weight(lam, i, 0) * (q[i] @ k[i]) * u
        for j, S in enumerate(states):  # state j is level j + 1, occupied when bit j of t is set
            if (t >> j) & 1:
                o = o + _weight(lam, i, j + 1) * (S.T @ q[i])
        out[i] = scale * o
        z = 0
        while (t >> z) & 1:  # the trailing ones of t
            z += 1
        merged = np.outer(k[i], u) + sum(states[:z], np.zeros((K, V)))
        states = [np.zeros((K, V)) for _ in range(z)] + [merged] + states[z + 1 :]
    return out, states
