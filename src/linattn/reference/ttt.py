"""The float64 oracle of TTT-Linear, one head, token by token.

Sun et al. (2024), "Learning to (Learn at Test Time): RNNs with Expressive Hidden States",
sections 2.1-2.7: the hidden state is the weight of a model ``f``, trained at test time by
gradient steps on a self-supervised loss, one step per mini-batch of ``b`` tokens. TTT-Linear's
model is linear with a layer norm and a residual: on a key ``k`` its output is
``k + LN_{w,b}(k W + h)`` (fla 0.6.0's form keeps the bias ``h`` of the linear map as state), and
the loss of token t is

    l_t(W, h) = 1/2 || LN_{w,b}(k_t W + h) - (v_t - k_t) ||^2,
    LN_{w,b}(x) = w * (x - mean(x)) / sqrt(var(x) + eps) + b.

Mini-batch gradient descent (section 2.5): every token of a mini-batch takes its gradient at the
state W_0, h_0 the mini-batch started from, and token t reads the state stepped by its own
learning rate over the tokens up to it:

    W_t = W_0 - eta_t sum_{s <= t} grad_W l_s(W_0, h_0),   h_t = h_0 - eta_t sum_{s <= t} grad_h l_s
    z_t = (scale q_t) W_t + h_t,   o_t = z_t + LN_{w,b}(z_t)

and the mini-batch ends on the last token's W_t, h_t. This is fla's definition (its naive
reference and its kernels agree): the output adds the layer norm to ``z_t`` itself, and a last
mini-batch shorter than ``b`` tokens (L of them) is padded to ``b`` with zero tokens, which move
nothing through W (their key is zero) but add their gradient ``grad_h l(W_0, h_0)`` at
``k = v = 0`` to the bias step, ``b - L`` times, with the last real token's learning rate.
The gradient here is the literal chain rule through the layer norm's Jacobian.
"""

from __future__ import annotations

import numpy as np


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """w * (x - mean x) / sqrt(var x + eps) + b (the biased variance)."""
    return w * (x - x.mean()) / np.sqrt(x.var() + eps) + b


def loss_gradient(k, v, W, h, w, b, eps):
    """(grad_W, grad_h) of 1/2 |LN(k W + h) - (v - k)|^2: the layer norm's Jacobian, explicitly."""
    x = k @ W + h
    D = x.shape[0]
    sigma = np.sqrt(x.var() + eps)
    x_hat = (x - x.mean()) / sigma
    jacobian = (np.eye(D) - np.ones((D, D)) / D - np.outer(x_hat, x_hat) / D) / sigma  # dx_hat/dx
    residual = w * x_hat + b - (v - k)
    grad_x = jacobian.T @ (w * residual)
    return np.outer(k, grad_x), grad_x


def ttt_linear(q, k, v, w, b, eta, scale, eps, mini_batch_size, initial_state=None):
    """TTT-Linear for one head (the module docstring), token by token.

    Args:
        q, k, v: [T, D]; w, b: [D] (the layer norm's); eta: [T] learning rates; scale, eps:
        floats; mini_batch_size: b >= 1; initial_state: None (zeros) or (W [D, D], h [D]).

    Returns:
        (o [T, D], (W [D, D], h [D])) in float64.
    """
    q, k, v, w, b, eta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, w, b, eta))
    T, D = q.shape
    if initial_state is None:
        W, h = np.zeros((D, D)), np.zeros(D)
    else:
        W, h = (np.array(x, dtype=np.float64) for x in initial_state)
    out = np.zeros((T, D))
    for start in range(0, T, mini_batch_size):
        W0, h0 = W, h
        sum_W, sum_h = np.zeros((D, D)), np.zeros(D)
        stop = min(start + mini_batch_size, T)
        for t in range(start, stop):
            gW, gh = loss_gradient(k[t], v[t], W0, h0, w, b, eps)
            sum_W, sum_h = sum_W + gW, sum_h + gh
            W_t, h_t = W0 - eta[t] * sum_W, h0 - eta[t] * sum_h
            z = (scale * q[t]) @ W_t + h_t
            out[t] = z + layer_norm(z, w, b, eps)
        padding = mini_batch_size - (stop - start)  # fla's zero tokens after a short last batch
        zero = np.zeros(D)
        for _ in range(padding):
            sum_h = sum_h + loss_gradient(zero, zero, W0, h0, w, b, eps)[1]
        W, h = W0 - eta[stop - 1] * sum_W, h0 - eta[stop - 1] * sum_h
    return out, (W, h)
