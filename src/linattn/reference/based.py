"""Based and ReBased, taken literally: causal attention with a polynomial kernel, normalised.

    o_t = sum_{s <= t} f(scale q_t^T k_s) v_s / (sum_{s <= t} f(scale q_t^T k_s) + eps)

Based (Arora et al. 2024, section 3.1): f(a) = 1 + a + a^2 / 2, the second-order Taylor
expansion of exp; ReBased (Aksenov et al. 2024): f(a) = a^2. fla 0.6.0's kernels add eps to the
denominator (1e-6 for Based, ``eps`` = 1e-5 by default for ReBased). Spec sections 3 and 4
(a feature map phi with phi(q)^T phi(k) = f(q^T k) makes it linear attention).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_flag, as_matrix, as_real, same_rows, same_shape


def _kernel_attention(f, q, k, v, scale, eps, normalize):
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_shape(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    scale, eps = as_real("scale", scale), as_real("eps", eps)
    normalize = as_flag("normalize", normalize)
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        weights = np.array([f(scale * q[t] @ k[s]) for s in range(t + 1)])
        numerator = weights @ v[: t + 1]
        out[t] = numerator / (weights.sum() + eps) if normalize else numerator
    return out


def based(q, k, v, *, scale=1.0, eps=1e-6, normalize=True):
    """Based for one head: q, k [T, K], v [T, V]; returns O [T, V], float64."""
    return _kernel_attention(lambda a: 1.0 + a + 0.5 * a * a, q, k, v, scale, eps, normalize)


def rebased(q, k, v, *, scale=1.0, eps=1e-5, normalize=True):
    """ReBased for one head: q, k [T, K], v [T, V]; returns O [T, V], float64."""
    return _kernel_attention(lambda a: a * a, q, k, v, scale, eps, normalize)
