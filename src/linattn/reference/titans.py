"""The float64 oracle of Titans' linear memory (fla's ``chunk_titans_linear``), one head.

Behrouz, Zhong and Mirrokni (2024), "Titans: Learning to Memorize at Test Time", section 3.1: a
memory ``M`` trained at test time by gradient descent with momentum and weight decay,

    S_t = eta_t S_{t-1} - theta_t grad l(M; k_t, v_t)       (the surprise, with momentum eta_t)
    M_t = (1 - alpha_t) M_{t-1} + S_t                        (the forgetting gate alpha_t)
    o_t = M_t(q_t)

and (section 3.2) the gradients of a chunk of b tokens taken at the memory the chunk started from,
so that a chunk's gradients are independent of each other. fla 0.6.0's linear memory (its only
implementation, ``fla.ops.titans.naive``: a token loop and a chunk form that agree) reads
``o_t = q_t M_t`` and adds ``LN_{w,b}(o_t)`` to it (a residual layer norm), and takes the loss of
TTT-Linear (``linattn.reference.ttt``), ``1/2 |LN_{w,b}(k_t M) - (v_t - k_t)|^2`` with
``LN_{w,b}(x) = w * x_hat + b``, ``x_hat = (x - mean x) / sigma``, ``sigma = sqrt(var x + eps)``.
Its gradient step is ``2 theta_t k_t^T u_t`` with, for ``g = w * (LN(x) - (v_t - k_t))`` over the
D = K = V columns,

    u_t = D g - sum(g) / (sigma D) - x_hat sum(g x_hat) / (sigma D).

That is fla's expression as written, not the layer norm's backward
``(D g - sum(g) - x_hat sum(g x_hat)) / (sigma D)`` (which ``linattn.ops.ttt`` uses): the
parentheses differ. linattn follows fla's definition, so that its entry point computes what
fla's does; this loop is that recurrence, written out.
"""

from __future__ import annotations

import numpy as np

from linattn.reference.ttt import layer_norm


def surprise(k, v, M, w, b, eps):
    """fla's u_t for the key k, value v at the memory M (the module docstring): [D]."""
    x = k @ M
    D = x.shape[0]
    sigma = np.sqrt(x.var() + eps)
    x_hat = (x - x.mean()) / sigma
    g = w * (w * x_hat + b - (v - k))
    return D * g - g.sum() / (sigma * D) - x_hat * (g * x_hat).sum() / (sigma * D)


def titans_linear(q, k, v, w, b, theta, alpha, eta, eps, chunk_size, initial_state=None):
    """Titans' linear memory for one head, token by token (the module docstring).

    Args:
        q, k, v: [T, D]; w, b: [D]; theta, alpha, eta: [T] (learning rate, forgetting gate,
        momentum); eps: float; chunk_size: b >= 1, the tokens sharing a gradient point;
        initial_state: None (zeros) or (M [D, D], S [D, D]).

    Returns:
        (o [T, D], (M [D, D], S [D, D])) in float64.
    """
    q, k, v, w, b, theta, alpha, eta = (
        np.asarray(x, dtype=np.float64) for x in (q, k, v, w, b, theta, alpha, eta)
    )
    T, D = q.shape
    if initial_state is None:
        M, S = np.zeros((D, D)), np.zeros((D, D))
    else:
        M, S = (np.array(x, dtype=np.float64) for x in initial_state)
    out = np.zeros((T, D))
    M_grad = M
    for t in range(T):
        if t % chunk_size == 0:
            M_grad = M  # the chunk's gradient point
        S = eta[t] * S - 2 * theta[t] * np.outer(k[t], surprise(k[t], v[t], M_grad, w, b, eps))
        M = (1 - alpha[t]) * M + S
        z = q[t] @ M
        out[t] = z + layer_norm(z, w, b, eps)
    return out, (M, S)
