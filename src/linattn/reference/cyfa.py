"""The float64 oracle of CyclicFlowAttention (CyFA), one head, token by token.

CyFA (fla 0.6.0, ``fla.ops.cyfa``; Y. Chen, "CyFA: Linear Sequence Modeling with
Relative-Time-Partitioned Memory", the CyclicFlowAttention repository) keeps two memories per head
over M relative-time slots (M even; P = M - 1 readout rows), a key memory ``H^k`` (K x M) and a
value memory ``H^v`` (M x V), and a clock ``lambda``. With ``alpha_t = exp(g_t)``, the pair
frequencies ``omega_m = 2 pi floor(m / 2) / P`` and the RMS-normalised query and key
``q~ = q / rms(q) * w_q``, ``k~ = k / rms(k) * w_k``, one token is

    lambda_t = lambda_{t-1} + delta_t
    a_t[m]   = c_m cos(omega_m lambda_t)  (m even),  -c_m sin(omega_m lambda_t)  (m odd),
               c_m = sqrt((1 if m < 2 else 2) / P)                 (the atom of slot m)
    H^k_t    = alpha_t H^k_{t-1} + k~_t (beta_t a_t)^T
    H^v_t    = alpha_t H^v_{t-1} + (beta_t a_t) v_t^T
    z_t      = R(lambda_t) H^k_t^T (scale q~_t)                     (M logits, rotated)
    p_t      = softmax(E z_t),   E = readout B                      (P readout rows)
    o_t      = H^v_t^T R(lambda_t)^T E^T p_t

where ``R(lambda)`` rotates each slot pair (2j, 2j + 1) by the angle ``omega_{2j} lambda`` and
``B`` (P x M) is the real Fourier basis ``B[r, m] = cos(r omega_m)`` (m even) or ``sin(r omega_m)``
(m odd), with column 0 scaled by ``P^-1/2``, column 1 zero and the others scaled by
``(2 / P)^1/2``. The definitions are fla's docstrings and ``naive_recurrent_cyfa``; this is the
literal loop, with the phases taken as ``omega lambda`` directly (fla reduces them modulo the
period first, which changes nothing but rounding).
"""

from __future__ import annotations

import numpy as np


def fourier_basis(num_slots: int) -> np.ndarray:
    """The P x M real Fourier basis ``B`` of the readout (the module docstring), P = M - 1."""
    P = num_slots - 1
    m = np.arange(num_slots)
    omega = (m // 2) * (2 * np.pi / P)
    r = np.arange(P)[:, None]
    basis = np.where(m % 2 == 1, np.sin(r * omega), np.cos(r * omega))
    basis[:, 0] *= P**-0.5
    basis[:, 1] = 0.0
    basis[:, 2:] *= (2.0 / P) ** 0.5
    return basis


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * weight


def _rotation(lam: float, num_slots: int) -> np.ndarray:
    """R(lambda): M x M, block diagonal, the pair (2j, 2j+1) rotated by omega_{2j} lambda."""
    P = num_slots - 1
    R = np.zeros((num_slots, num_slots))
    for j in range(num_slots // 2):
        phase = j * (2 * np.pi / P) * lam
        c, s = np.cos(phase), np.sin(phase)
        R[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = [[c, -s], [s, c]]
    return R


def atom(lam: float, num_slots: int) -> np.ndarray:
    """The write direction a(lambda) over the M slots (the module docstring)."""
    P = num_slots - 1
    m = np.arange(num_slots)
    phase = (m // 2) * (2 * np.pi / P) * lam
    c = np.sqrt(np.where(m < 2, 1.0, 2.0) / P)
    return c * np.where(m % 2 == 0, np.cos(phase), -np.sin(phase))


def cyfa(
    q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight, q_norm_eps, k_norm_eps,
    scale, initial_state=None,
):  # fmt: skip
    """CyFA for one head, token by token (the module docstring's recurrence).

    Args:
        q, k: [T, K]; v: [T, V]; g, delta, beta: [T] (log-decay, clock step, write strength).
        readout: [P, P] (P = M - 1, M even); q_norm_weight, k_norm_weight: [K].
        q_norm_eps, k_norm_eps, scale: floats.
        initial_state: None (zeros) or (H^k [K, M], H^v [M, V], lambda: a float).

    Returns:
        (o [T, V], (H^k [K, M], H^v [M, V], lambda)) in float64.
    """
    q, k, v, g, delta, beta, readout, wq, wk = (
        np.asarray(x, dtype=np.float64)
        for x in (q, k, v, g, delta, beta, readout, q_norm_weight, k_norm_weight)
    )
    T, K = q.shape
    V = v.shape[1]
    P = readout.shape[0]
    M = P + 1
    if readout.shape != (P, P) or M % 2:
        raise ValueError(f"readout must be [P, P] with P + 1 even, got {readout.shape}")
    table = readout @ fourier_basis(M)  # E: [P, M]
    if initial_state is None:
        Hk, Hv, lam = np.zeros((K, M)), np.zeros((M, V)), 0.0
    else:
        Hk, Hv, lam = (np.array(x, dtype=np.float64) for x in initial_state)
        lam = float(lam)
    out = np.zeros((T, V))
    for t in range(T):
        lam = lam + delta[t]
        alpha = np.exp(g[t])
        w = beta[t] * atom(lam, M)
        Hk = alpha * Hk + np.outer(_rms(k[t], wk, k_norm_eps), w)
        Hv = alpha * Hv + np.outer(w, v[t])
        R = _rotation(lam, M)
        z = R @ (Hk.T @ (scale * _rms(q[t], wq, q_norm_eps)))
        logits = table @ z
        p = np.exp(logits - logits.max())
        p /= p.sum()
        out[t] = Hv.T @ (R.T @ (table.T @ p))
    return out, (Hk, Hv, lam)
