"""Wall attention, taken literally: one query at a time, one key at a time (fla 0.6.0's
``naive_wall_attn``, contributed by Tilde Research).

Softmax attention whose logit between query t and key s decays each key channel n by the
gates between them, plus an optional scalar (FoX) gate and an attention sink:

    l_ts = scale sum_n q_tn k_sn prod_{s < i <= t} exp(g_in) + sum_{s < i <= t} gs_i,
    o_t = sum_s exp(l_ts) v_s / (sum_s exp(l_ts) + exp(sink)),   t - window_size < s <= t.
"""

from __future__ import annotations

import math

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_real, same_rows, same_shape


def wall_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    g_scalar: np.ndarray | None = None,
    scale: float | None = None,
    window_size: int | None = None,
    sink: float | None = None,
) -> np.ndarray:
    """Wall attention of one head (the module docstring): q, k, g [T, K], v [T, V],
    g_scalar [T] -> o [T, V]."""
    q, k, v, g = (as_matrix(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("g", g)))
    same_shape(("q", "k"), q, k)
    same_shape(("q", "g"), q, g)
    same_rows(("q", "v"), q, v)
    T = q.shape[0]
    gs = np.zeros(T) if g_scalar is None else np.asarray(g_scalar, dtype=np.float64)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else as_real("scale", scale)
    window = T if window_size is None else as_positive_int("window_size", window_size)
    o = np.zeros((T, v.shape[1]))
    for t in range(T):
        keys, logits = [], []
        decay, scalar = np.zeros(q.shape[1]), 0.0  # sums over s < i <= t, grown walking back
        for s in range(t, max(t - window, -1), -1):
            keys.append(s)
            logits.append(scale * float(np.sum(q[t] * k[s] * np.exp(decay))) + scalar)
            decay = decay + g[s]
            scalar += gs[s]
        top = max(logits) if sink is None else max(*logits, as_real("sink", sink))
        weights = [math.exp(x - top) for x in logits]
        Z = sum(weights) + (0.0 if sink is None else math.exp(sink - top))
        for w, s in zip(weights, keys, strict=True):
            o[t] += (w / Z) * v[s]
    return o
