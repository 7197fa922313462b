"""The affine map of a block of tokens: S_out = M S_in + N (spec section 8, the WY form).

Every mechanism of the table is affine in its state, so a block of tokens acts on the incoming
state as one affine map. It comes from the chunk form's own loop (``chunk.forward_chunks``, on the
terms without the output terms), chunk by chunk, so its cost is linear in the number of tokens and
nothing of size T x T is formed:

- additive rule: N is the state the block writes from S = 0, and M = Diag(exp G_T), the product
  of the chunks' D = exp(G_C);
- delta and generalized delta rules (whose writes read the state): the recurrence acts on each
  column of the state independently, so running it from [0 | I] on the values [V | 0] ends in
  [N | M] (the zero-value columns carry I to M I = M, the value columns carry 0 to N). Per chunk
  this is M_c = Diag(exp G_C) - Ke^T W, N_c = Ke^T U0, with W = T (K * exp G), U0 = T V,
  T = (I + L)^{-1} diag(beta) the UT transform; without decay M = I - K^T T K, the compact WY
  form of prod_t (I - beta_t k_t k_t^T). The generalized rule (``rules.dplr``) likewise: its
  M_c = Diag(exp G_C) + Ae^T T Bd is its chunk's WY form.

Context parallelism (``linattn.distributed.maps``) exchanges these maps between ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops import rules
from linattn.ops._layout import to_internal
from linattn.ops.chunk import chunk_terms, forward_chunks
from linattn.ops.delta_product import householder_count, interleave_gate
from linattn.ops.mechanism import Mechanism

# The chunk the maps are computed in when the caller names none (the ops' default).
CHUNK = 64


def affine_map(
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    mech: Mechanism,
    chunk_size: int = CHUNK,
) -> tuple[Tensor | None, Tensor]:
    """(M, N) of a block of tokens in the internal layout (checked inputs, compute dtype).

    k: [B, H, T, K]; v: [B, H, T, V]; beta: [B, H, T] or None; g: None, [B, H, T, 1] or
    [B, H, T, K] (beta [B, H, T, 2K] = [a | b] for the generalized rule). M in the cheapest form
    the mechanism allows: None (I: no gate, additive rule), [B, H, 1|K, 1] (the diagonal
    Diag(exp G_T): additive rule with a gate) or [B, H, K, K] (the rules whose writes read the
    state: delta, dplr); N: [B, H, K, V].
    """
    B, H, T, K = k.shape
    V = v.shape[-1]
    if 0 in (B, H, T):
        return _empty_map(k, v, beta, g, mech)
    P = B * H
    start = k.new_zeros(P, K, V)
    full = mech.rule.READS_STATE  # M is a full K x K matrix
    if full:  # run from [0 | I] on [V | 0]: the final state is [N | M]
        v = torch.cat([v, v.new_zeros(B, H, T, K)], dim=-1)  # [B, H, T, V + K]
        eye = torch.eye(K, dtype=k.dtype, device=k.device).expand(P, K, K)
        start = torch.cat([start, eye], dim=-1)  # [P, K, V + K]
    terms = chunk_terms(None, k, v, beta, g, min(chunk_size, T), mech)
    _, _, S = forward_chunks(terms, start)  # the chunk loop without outputs
    S = S.view(B, H, K, -1)
    if full:
        return S[..., V:], S[..., :V]
    M = terms.D.prod(dim=0).view(B, H, -1, 1) if mech.decays else None  # [B, H, 1|K, 1]
    return M, S


def _empty_map(k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None, mech: Mechanism):
    """A block of no tokens (or no batch or head) is the identity map: M = I (in the mechanism's
    stored form), N = 0.

    The sum of the (empty) inputs is an exact 0 that keeps them in the graph, so that each gets
    an empty gradient of its shape, as from PyTorch's own ops.
    """
    B, H, _, K = k.shape
    link = sum(x.sum() for x in (k, v, beta, g) if x is not None)  # 0: all are empty
    N = k.new_zeros(B, H, K, v.shape[-1]) + link
    if mech.rule.READS_STATE:
        return torch.eye(K, dtype=k.dtype, device=k.device).expand(B, H, K, K) + link, N
    if not mech.decays:
        return None, N
    return k.new_ones(B, H, 1 if mech.gate == "head" else K, 1) + link, N


def full_matrix(M: Tensor | None, N: Tensor, mech: Mechanism) -> Tensor:
    """M in ``affine_map``'s stored form as the [B, H, K, K] matrix."""
    B, H, K, _ = N.shape
    if mech.rule.READS_STATE:
        return M
    if not mech.decays:
        return torch.eye(K, dtype=N.dtype, device=N.device).expand(B, H, K, K)
    return torch.diag_embed(M[..., 0].expand(B, H, K))  # Diag(exp G_T)


def chunk_affine_map(
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    *,
    a: Tensor | None = None,
    b: Tensor | None = None,
    num_householder: int = 1,
) -> tuple[Tensor, Tensor]:
    """The pair (M, N) with S_out = M S_in + N for one block of tokens.

    M is the product of the block's transitions (the latest on the left) and N the state the block
    writes from zero. With the cumulative log-gate G of the block (G_T its last row):

    - additive rule (beta None): M = Diag(exp G_T), N = (K * exp(G_T - G))^T V;
    - delta rule: the product of the chunks' M_c = Diag(exp G_C) - (K * exp(G_C - G))^T W,
      N composed likewise from N_c = (K * exp(G_C - G))^T U0 (the module docstring); without decay
      M = I - K^T T K, the compact WY form of prod_t (I - beta_t k_t k_t^T);
    - generalized delta rule (a, b given): the product of the chunks' WY forms
      M_c = Diag(exp G_C) + Ae^T T Bd (``rules.dplr``), N likewise;
    - Gated DeltaProduct (``num_householder`` n_h > 1, ``gated_delta_product``): the delta rule's
      map of the T n_h writes, g acting once per token (at its first write).

    Computed in chunks of 64 tokens: linear in T.

    Args:
        k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H] in [0, 2] or None (additive rule);
        g: None, [B, T, H] or [B, T, H, K], log-decay <= 0 (-inf: a reset). Keys are used as given.
        a, b: None, or both [B, T, H, K] (beta then None): the generalized rule's transitions
            Diag(exp g_t) + a_t b_t^T (``generalized_delta_rule``).
        num_householder: n_h >= 1 writes per token (with beta): k, v, beta then have T n_h rows
            (fla's layout) and g has T rows, one per token.

    Returns:
        M: [B, H, K, K] and N: [B, H, K, V], in float32 (float64 for float64 inputs).
    """
    B, T, H, K, V = _checks.kv(k, v)  # T: rows (writes)
    n = householder_count(num_householder)
    if n > 1:
        g = _product_gate(beta, g, (B, T, H, K), n)
    given = {"beta": beta, "a": a, "b": b}
    rule = rules.taking(frozenset(name for name, x in given.items() if x is not None))
    if a is not None or b is not None:
        if a is None or b is None or beta is not None:
            raise ValueError("a and b come together, and without beta (the generalized rule)")
        _checks.vectors("a", a, B, T, H, K, layout="[B, T, H, K]")
        _checks.vectors("b", b, B, T, H, K, layout="[B, T, H, K]")
    elif beta is not None:
        _checks.beta(beta, B, T, H)
    if n == 1:
        _checks.gate(g, B, T, H, K)
    slot = rule.pack(
        {name: x for name, x in given.items() if x is not None}, compute_dtype(k.dtype)
    )
    mech = Mechanism.of(None, g, rule.NAME)
    M, N = affine_map(*to_internal(k, v, beta=slot, g=g), mech)
    return full_matrix(M, N, mech), N


def _product_gate(beta: Tensor | None, g: Tensor | None, sizes: tuple[int, ...], n: int):
    """DeltaProduct's gate (checked): g [B, T / n_h, H(, K)] of its tokens, on the T rows (writes)
    at each token's first write (``interleave_gate``)."""
    B, T, H, K = sizes
    if beta is None:
        raise ValueError("num_householder > 1 needs beta: the writes are the delta rule's")
    if T % n:
        raise ValueError(
            f"k, v and beta must have T * num_householder rows, a multiple of {n}, got {T}"
        )
    _checks.gate(g, B, T // n, H, K)
    return interleave_gate(g, n)
