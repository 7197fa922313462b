"""Stick-breaking attention, taken literally: one query at a time, walking back over its keys
(Tan et al., 2024, "Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth
Study", eq. 2 and 3; fla's convention for which keys a query sees).

Query t breaks a stick of length 1: the nearest visible key s takes the share
beta_ts = sigmoid(scale q_t^T k_s) of it, the next one the same share of what is left, and so on:

    A_ts = beta_ts prod_{s < i < t} (1 - beta_ti)     (s < i <= t with attend_current),
    o_t = sum_s A_ts v_s,    rem_t = prod_s (1 - beta_ts) = 1 - sum_s A_ts.

The weights are not normalised; rem_t is the stick left unused (fla returns it).
"""

from __future__ import annotations

import math

import numpy as np

from linattn.reference.checks import as_flag, as_matrix, as_real, same_rows


def stickbreaking_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float | None = None,
    attend_current: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Stick-breaking attention of one head (the module docstring), token by token.

    Shapes: q, k [T, K], v [T, V] -> (o [T, V], rem [T]). ``scale`` None means 1 / sqrt(K).
    Without ``attend_current`` query t sees the keys s < t (o_0 = 0, rem_0 = 1).
    """
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_rows(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    attend_current = as_flag("attend_current", attend_current)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else as_real("scale", scale)
    T = q.shape[0]
    o, rem = np.zeros((T, v.shape[1])), np.ones(T)
    for t in range(T):
        stick = 1.0
        first = t if attend_current else t - 1
        for s in range(first, -1, -1):  # the nearest key first
            beta = 1.0 / (1.0 + math.exp(-scale * float(q[t] @ k[s])))
            o[t] += beta * stick * v[s]
            stick *= 1.0 - beta
        rem[t] = stick
    return o, rem
