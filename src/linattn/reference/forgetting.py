"""The Forgetting Transformer's attention, taken literally: one query at a time, one key at a
time (Lin et al., 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate", eq. 3).

Query t gives key s <= t the logit scale q_t^T k_s plus the log forget gates of the tokens after
s up to t, and a softmax over them (spec section 2 with a decay between query and key):

    l_ts = scale q_t^T k_s + sum_{s < i <= t} log f_i,    o_t = sum_s exp(l_ts) v_s / Z_t,
    Z_t = sum_s exp(l_ts) + exp(sink).

``window_size`` keeps the keys t - window_size < s <= t; ``sink`` (fla's ``sink_bias``, GPT-OSS)
adds a logit with no value to the denominator. log f = 0 is causal softmax attention.
"""

from __future__ import annotations

import math

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_real, as_vector, same_rows


def forgetting_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    log_f: np.ndarray | None = None,
    scale: float | None = None,
    window_size: int | None = None,
    sink: float | None = None,
) -> np.ndarray:
    """Forgetting attention of one head (the module docstring), a loop over queries and keys.

    Shapes: q, k [T, K], v [T, V], log_f [T] (None: zeros) -> o [T, V]. ``scale`` None means
    1 / sqrt(K); ``sink`` None means no sink.
    """
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_rows(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    T = q.shape[0]
    log_f = np.zeros(T) if log_f is None else as_vector("log_f", log_f, T)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else as_real("scale", scale)
    window = T if window_size is None else as_positive_int("window_size", window_size)
    o = np.zeros((T, v.shape[1]))
    for t in range(T):
        keys, logits = [], []
        decay = 0.0  # sum_{s < i <= t} log f_i, grown one gate at a time walking back from t
        for s in range(t, max(t - window, -1), -1):
            keys.append(s)
            logits.append(scale * float(q[t] @ k[s]) + decay)
            decay += log_f[s]
        top = max(logits) if sink is None else max(*logits, as_real("sink", sink))
        weights = [math.exp(x - top) for x in logits]
        Z = sum(weights) + (0.0 if sink is None else math.exp(sink - top))
        for w, s in zip(weights, keys, strict=True):
            o[t] += (w / Z) * v[s]
    return o
