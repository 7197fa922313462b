"""What every rule shares: reading the state (``o_t = S_t^T q_t``; the delta rule's S^T k_t)."""

from __future__ import annotations

from torch import Tensor


def read(S: Tensor, x: Tensor) -> Tensor:
    """S^T x for every batch and head: S [..., K, V], x [..., K] -> [..., V] (broadcasting: x
    [B, H, 1, K] reads the G states [B, H, G, K, V] of its value heads)."""
    return (x.unsqueeze(-2) @ S).squeeze(-2)  # [..., 1, K] @ [..., K, V]
