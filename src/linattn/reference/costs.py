"""The cost model of section 9: operations and memory of one head, and of one layer.

An operation is one floating-point addition or multiplication; an (a x b) @ (b x c) product costs
2abc (section 1). n tokens, head dimension d (values have length d too), r features, chunks of C
tokens, step t of generation, model width d_model. Every function returns an exact count.
"""

from __future__ import annotations

from linattn.reference.checks import as_positive_int


def softmax_training_ops(n: int, d: int) -> int:
    """Section 2 / 9: 4 n^2 d (the scores Q K^T and the product P V, 2 n^2 d each)."""
    n, d = as_positive_int("n", n), as_positive_int("d", d)
    return 4 * n * n * d


def linear_attention_ops(n: int, r: int, d: int) -> int:
    """Section 4: 4 n r d, unmasked linear attention in the right order (phi(K)^T V, 2 n r d,
    then phi(Q) M, 2 n r d)."""
    n, r, d = _sizes(n=n, r=r, d=d)
    return 4 * n * r * d


def linear_training_ops(n: int, r: int, d: int, C: int) -> int:
    """Section 5.1 / 9: 2 n C (r + d) + 4 n r d, causal linear attention in blocks of C.

    Inside the blocks, n / C masked C x C products of 2 C^2 (r + d); across them, the state
    products of 4 C r d per block.
    """
    n, r, d, C = _sizes(n=n, r=r, d=d, C=C)
    return 2 * n * C * (r + d) + 4 * n * r * d


def delta_training_ops(n: int, r: int, d: int, C: int) -> int:
    """Section 8 / 9: n (4 C r + 3 C d + 6 r d), the delta rule in blocks of C (n / C chunks of
    ``delta_chunk_ops``)."""
    n, r, d, C = _sizes(n=n, r=r, d=d, C=C)
    return n * (4 * C * r + 3 * C * d + 6 * r * d)


def dplr_training_ops(n: int, r: int, d: int, C: int) -> int:
    """The generalized delta rule in blocks of C: n (9 C r + 7 C d + 8 r d).

    Per chunk, the products A_qk, A_qa, A_bk, A_ba (each 2 C^2 r) and the solve for the reads
    (C^2 (r + d)), the outputs and pseudo-values (5 C^2 d, the stacked A_q U over 2C rows
    included) and the state's products over the stacked 2C rows (8 C r d): section 8's count
    for the diagonal-plus-low-rank write (``linattn.ops.rules.dplr``).
    """
    n, r, d, C = _sizes(n=n, r=r, d=d, C=C)
    return n * (9 * C * r + 7 * C * d + 8 * r * d)


def linear_chunk_ops(C: int, r: int, d: int) -> int:
    """Section 8: one chunk of the additive rule costs 2 C^2 (r + d) + 4 C r d."""
    C, r, d = _sizes(C=C, r=r, d=d)
    return 2 * C * C * (r + d) + 4 * C * r * d


def delta_chunk_ops(C: int, r: int, d: int) -> int:
    """Section 8: one chunk of the delta rule costs 4 C^2 r + 3 C^2 d + 6 C r d (the masked
    products counted in full, the forward substitution at C^2 d)."""
    C, r, d = _sizes(C=C, r=r, d=d)
    return 4 * C * C * r + 3 * C * C * d + 6 * C * r * d


def delta_to_linear_chunk_ratio(C: int, r: int, d: int) -> float:
    """Section 8: delta_chunk_ops / linear_chunk_ops; with r = d it is (7 C + 6 d) / (4 C + 4 d),
    between 1.5 (C << d) and 1.75 (C >> d)."""
    return delta_chunk_ops(C, r, d) / linear_chunk_ops(C, r, d)


def softmax_step_ops(t: int, d: int) -> int:
    """Section 2 / 9: about 4 t d operations at generation step t (read the whole KV cache)."""
    t, d = as_positive_int("t", t), as_positive_int("d", d)
    return 4 * t * d


def linear_step_ops(r: int, d: int) -> int:
    """Section 5 / 9: about 4 r d operations per generation step.

    Write phi(k) v^T and read S^T phi(q), 2 r d each.
    """
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return 4 * r * d


def delta_step_ops(r: int, d: int) -> int:
    """Section 9: about 6 r d operations per generation step.

    Read S^T k, write k u^T and read S^T q, 2 r d each.
    """
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return 6 * r * d


def kv_cache_numbers(t: int, d: int) -> int:
    """Section 2 / 9: the KV cache after t tokens holds 2 t d numbers (keys and values)."""
    t, d = as_positive_int("t", t), as_positive_int("d", d)
    return 2 * t * d


def linear_state_numbers(r: int, d: int) -> int:
    """Section 5 / 9: the state of linear attention holds r d + r numbers (S and z)."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return r * d + r


def delta_state_numbers(r: int, d: int) -> int:
    """Section 9: the state of the delta rule holds r d numbers (no normaliser)."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return r * d


# --- beyond a fixed memory: decoding memory and work at step t, one head ---------------


def log_linear_levels(t: int) -> int:
    """Log-linear attention (Guo, Yang et al. 2025): the Fenwick hierarchy over t tokens keeps at
    most floor(log2 t) + 1 level states (one per bit of t)."""
    return as_positive_int("t", t).bit_length()


def log_linear_state_numbers(t: int, r: int, d: int) -> int:
    """Log-linear attention over an r x d memory: a level state of r d numbers per level."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return log_linear_levels(t) * r * d


def log_linear_step_ops(t: int, r: int, d: int) -> int:
    """About 2 (L + 1) r d operations at step t: read each of the L level states (2 r d each,
    weighted by its lambda) and write the newest (2 r d); the Fenwick merges add states (r d
    each, at most L a step, amortised 2 r d) and are left out, like the gates."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return 2 * (log_linear_levels(t) + 1) * r * d


def mesa_state_numbers(r: int, d: int) -> int:
    """MesaNet (von Oswald et al. 2025): the two states H = sum k k^T (r x r) and G = sum k v^T
    (r x d): r^2 + r d numbers."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    return r * r + r * d


def mesa_step_ops(r: int, d: int, iterations: int = 30) -> int:
    """About 2 (m + 1) r^2 + 4 r d operations per step: write H and G (2 r^2 + 2 r d), m
    conjugate-gradient iterations of one product with H each (2 r^2; fla's default m = 30),
    then read G^T q* (2 r d)."""
    r, d = as_positive_int("r", r), as_positive_int("d", d)
    m = as_positive_int("iterations", iterations)
    return 2 * (m + 1) * r * r + 4 * r * d


def forgetting_cache_numbers(t: int, d: int) -> int:
    """FoX (Lin et al. 2025): the KV cache and each cached token's cumulative log forget gate,
    2 t d + t numbers."""
    return kv_cache_numbers(t, d) + as_positive_int("t", t)


def path_step_ops(t: int, d: int) -> int:
    """PaTH (Yang et al. 2025) at step t, about 8 t d operations: the new Householder factor
    I - beta w w^T applied to every cached key (2 t d for w^T k, 2 t d for the update), then
    softmax attention over the cache (4 t d)."""
    return 2 * softmax_step_ops(t, d)


def deltaformer_step_ops(t: int, d: int) -> int:
    """DeltaFormer (Zhong et al. 2025) at step t, about 8 t d operations: the new token's u_t
    attends over the cached keys and u's (4 t d), then q_t over the same cache (4 t d)."""
    return 2 * softmax_step_ops(t, d)


def break_even_tokens(r: int, d: int) -> int:
    """Section 5 / Figure 3: the state is the size of the cache after about
    (r d + r) // (2 d) tokens (64 for r = d = 128; the spec rounds down)."""
    return linear_state_numbers(r, d) // (2 * as_positive_int("d", d))


def layer_dense_ops(n: int, d_model: int) -> int:
    """Section 9: the four projections and an MLP of width 4 d_model cost 24 n d_model^2."""
    n, d_model = as_positive_int("n", n), as_positive_int("d_model", d_model)
    return 24 * n * d_model * d_model


def layer_softmax_ops(n: int, d_model: int) -> int:
    """Section 9: the softmax attention products of all heads cost 4 n^2 d_model."""
    n, d_model = as_positive_int("n", n), as_positive_int("d_model", d_model)
    return 4 * n * n * d_model


def layer_linear_ops(n: int, r: int, d_model: int) -> int:
    """Section 9: linear attention costs 4 n r d_model for all heads."""
    n, r = as_positive_int("n", n), as_positive_int("r", r)
    return 4 * n * r * as_positive_int("d_model", d_model)


def crossover_tokens(d_model: int) -> int:
    """Section 9: 4 n^2 d_model > 24 n d_model^2 exactly when n > 6 d_model; returns 6 d_model."""
    return 6 * as_positive_int("d_model", d_model)


def linear_fraction(r: int, d_model: int) -> float:
    """Section 9: linear attention is 4 n r d_model / (24 n d_model^2) = r / (6 d_model) of the
    rest of the layer, at every length."""
    r, d_model = as_positive_int("r", r), as_positive_int("d_model", d_model)
    return r / (6 * d_model)


def attention_matrix_bytes(n: int, bytes_per_number: int = 2) -> int:
    """Section 2: P has n^2 entries, n^2 * bytes_per_number bytes (2 GiB at n = 32,768, 2 bytes)."""
    n = as_positive_int("n", n)
    return n * n * as_positive_int("bytes_per_number", bytes_per_number)


def _sizes(**sizes: int) -> tuple[int, ...]:
    """Each size checked as a positive integer, in the order given."""
    return tuple(as_positive_int(name, value) for name, value in sizes.items())
