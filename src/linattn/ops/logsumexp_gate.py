"""The fused running log-sum-exp gate (``csrc/logsumexp.cpp``), LightNet's key and decay gate.

From key logits x [B, T, D] and a starting log-normaliser z0 [B, D] (None: no mass yet), the
gate z_t = log(exp(z_{t-1}) + exp(x_t)) gives keys k_t = exp(x_t - z_t) and log-decays
g_t = z_{t-1} - z_t (Qin et al. 2024b, LightNet). ``linattn.compat.lightnet`` holds the PyTorch
form and the autograd function; the ops package owns the compiled kernels, so the calls into
them are here.
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops import _native


def fused(x: Tensor) -> bool:
    """Whether the compiled gate serves x: float32 on the CPU, with the kernels loaded."""
    return _native.applies(x)


def forward(x: Tensor, z0: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(k, g, z_T) for contiguous x [B, T, D] and z0 [B, D] or None, in one pass over x."""
    return _native.kernel("logsumexp_gate_forward")(x, z0)


def backward(
    k: Tensor,
    g: Tensor,
    dk: Tensor | None,
    dg: Tensor | None,
    dz_last: Tensor | None,
    first_constant: Tensor,
) -> tuple[Tensor, Tensor]:
    """(dx, dz0) from the forward's k, g [B, T, D], their gradients (None: zeros), that of z_T
    and ``first_constant`` [B, D] (bool: g_0 is the constant 0 there, no prior mass)."""
    return _native.kernel("logsumexp_gate_backward")(k, g, dk, dg, dz_last, first_constant)
