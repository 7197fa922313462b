"""fla's DeepSeek Sparse Attention (``fla.ops.dsa``): ``naive_dsa`` and its lightning indexer
``naive_dsa_indexer`` (fla.ops.dsa.naive), on ``linattn.ops.dsa`` (whose docstring gives the
formula; DeepSeek-V3.2, arXiv 2512.02556).

fla 0.6.0 has DSA as PyTorch reference code only: no Triton kernel, no layer, no model. These
follow it: indices [B, T, topk] best first, offsets within each sequence, padded with -1; the
selection shared by every query head; GQA with HQ = G * H; ``naive_dsa`` runs the indexer with
ReLU and its own default scale 1 / sqrt(DI), ``naive_dsa_indexer`` with no activation unless
asked; o in q's dtype. Where they differ from fla: ties in the index score go to the earlier
token (fla's ``torch.topk`` leaves their order unspecified), and a query whose given indices
hold no visible token reads 0 where fla's softmax gives NaN.
"""

from __future__ import annotations

import warnings

import torch

from linattn.ops.dsa import deepseek_sparse_attention, lightning_indexer


def naive_dsa_indexer(
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    w_idx: torch.Tensor | None = None,
    topk: int = 2048,
    scale: float | None = None,
    activation: str | None = None,
    cu_seqlens: torch.LongTensor | None = None,
) -> torch.LongTensor:
    """fla's ``naive_dsa_indexer``: the ``topk`` tokens s <= t of largest
    I_ts = sum_j w_tj act(scale q_idx_tj . k_idx_s) for each query t, [B, T, topk], -1 padded."""
    return lightning_indexer(q_idx, k_idx, w_idx, topk=topk, scale=scale, activation=activation,
                             cu_seqlens=cu_seqlens)  # fmt: skip


def naive_dsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_idx: torch.Tensor,
    k_idx: torch.Tensor,
    w_idx: torch.Tensor | None = None,
    indices: torch.LongTensor | None = None,
    topk: int = 2048,
    scale: float | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    return_indices: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.LongTensor]:
    """fla's ``naive_dsa``: o_t = sum_{s in S_t} softmax_s(scale q_t . k_s) v_s over the tokens
    S_t its lightning indexer keeps (or ``indices``); q [B, T, HQ, K], k [B, T, H, K], v
    [B, T, H, V]. Returns o [B, T, HQ, V] (and the indices with ``return_indices``)."""
    if not isinstance(return_indices, bool):
        raise TypeError(f"return_indices must be a bool, got {type(return_indices).__name__}")
    if indices is not None and q_idx is not None:
        warnings.warn("`indices` is provided, the lightning indexer is skipped", stacklevel=2)
    o, used = deepseek_sparse_attention(
        q, k, v, q_idx, k_idx, w_idx, topk=topk, indices=indices, scale=scale,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
    o = o.to(q.dtype)
    return (o, used) if return_indices else o
