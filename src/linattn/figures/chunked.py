"""Figure 8: the delta rule in chunks (spec section 8).

One chunk of a random example is drawn from its computed matrices: the unit lower-triangular
I + L and the masked scores Q K^T * L_C, the library's own chunk terms (``ops.chunk.chunk_terms``),
the pseudo-values U from ``reference.pseudo_values``, and the chunked linear attention that
follows. The agreement with the recurrence (``reference.chunked_delta_rule`` against
``reference.delta_rule``) and the WY form of the transitions (``reference.wy_transition`` against
``reference.transition_product``) are computed and printed in the figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from linattn import reference
from linattn.figures import style
from linattn.ops.chunk import chunk_terms
from linattn.ops.mechanism import Mechanism

CAPTION = (
    "Figure 8. The delta rule in chunks: one triangular solve gives the pseudo-values, and the "
    "rest is chunked linear attention."
)


def _example(n: int, r: int, seed: int):
    """Unit queries and keys, Gaussian values, write strengths through a sigmoid (spec 8)."""
    rng = np.random.default_rng(seed)
    Q, K = (rng.standard_normal((n, r)) for _ in range(2))
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.standard_normal((n, r))
    beta = 1 / (1 + np.exp(-rng.standard_normal(n)))
    return Q, K, V, beta


def _chunk_matrices(q, k, v, b) -> tuple[np.ndarray, np.ndarray]:
    """I + L and Q K^T * L_C of one chunk of the delta rule, from the library's chunk terms."""
    # (C, d) -> [1, 1, C, d]: one batch, one head, one chunk of C tokens
    q, k, v, b = (torch.from_numpy(x)[None, None] for x in (q, k, v, b))
    terms = chunk_terms(q, k, v, b, None, k.shape[2], Mechanism("delta", "none"))
    return terms.own.I_plus_L[0, 0].numpy(), terms.A_qk[0, 0].numpy()


def _operator(ax, x: float, y: float, symbol: str) -> None:
    ax.text(x, y, symbol, ha="center", va="center", fontsize=16, color=style.INK)


def chunked_delta(
    out_dir: Path | str, n: int = 24, r: int = 6, C: int = 8, seed: int = 3
) -> list[Path]:
    """Figure 8: the chunks along the sequence, and inside chunk 2 the three steps of section 8.

    1. (I + L) U = diag(beta) (V - K S),  L_ti = beta_t k_t^T k_i for i < t   (C x C solve)
    2. O = Q S + (Q K^T * L_C) U                                               (linear attention)
    3. S <- S + K^T U
    """
    plt = style.pyplot()
    Q, K, V, beta = _example(n, r, seed)
    chunk = slice(C, 2 * C)  # the second chunk: its state S is not zero
    _, S = reference.delta_rule(Q[:C], K[:C], V[:C], beta[:C])
    q, k, v, b = Q[chunk], K[chunk], V[chunk], beta[chunk]
    U = reference.pseudo_values(k, v, b, S)  # (C, d)
    unit_lower, masked = _chunk_matrices(q, k, v, b)  # I + L and Q K^T * L_C, (C, C)
    right = b[:, None] * (v - k @ S)  # diag(beta) (V - K S), (C, d)
    O = q @ S + masked @ U
    chunked, _ = reference.chunked_delta_rule(Q, K, V, beta, C)
    recurrent, _ = reference.delta_rule(Q, K, V, beta)
    chunk_error = float(np.abs(chunked - recurrent).max())
    wy_error = float(
        np.abs(reference.wy_transition(k, b) - reference.transition_product(k, b)).max()
    )

    fig = plt.figure(figsize=(10, 10.4))
    ax = style.blank_axes(fig)
    gap = 1.6
    # The sequence: n tokens in chunks of C, the state carried from one chunk to the next.
    y = 36.0
    scale = 1.0  # token cells are drawn 1 unit wide
    for c in range(n // C):
        x0 = c * (C * scale + 3)
        for t in range(C):
            ax.add_patch(
                style._rectangle(
                    (x0 + t * scale, y),
                    scale,
                    scale,
                    style.ERROR if c == 1 else style.SCORE,
                    fill="#fbe3e3" if c == 1 else "white",
                )
            )
        ax.text(
            x0 + C * scale / 2,
            y + scale + 0.4,
            f"chunk {c + 1}: tokens {c * C + 1}-{(c + 1) * C}",
            ha="center",
            va="bottom",
            fontsize=11,
        )
        ax.text(
            x0 - 1.5,
            y + scale / 2,
            f"$S_{{[{c + 1}]}}$",
            ha="center",
            va="center",
            color=style.STATE,
            fontsize=12,
        )
        if c:
            style.arrow(ax, (x0 - 3 + 0.2, y - 0.6), (x0 - 0.2, y - 0.6), color=style.STATE)
    ax.text(
        0,
        y - 2.0,
        f"$n = {n}$, $r = d = {r}$, $C = {C}$. The state is carried across chunks; "
        "inside chunk 2 (red):",
        fontsize=12,
        va="top",
    )
    # Step 1: one triangular solve for the pseudo-values.
    y = 21.0
    ax.text(
        0,
        y + C + 2.2,
        "1.  Pseudo-values: one unit lower-triangular solve",
        fontsize=13,
        color=style.VALUE,
    )
    x = 0.0
    style.matrix_block(ax, x, y, unit_lower, style.KEY, "$I + L$", "$C \\times C$", symmetric=True)
    x += C + gap / 2
    _operator(ax, x, y + C / 2, "·")
    x += gap / 2
    style.matrix_block(ax, x, y, U, style.VALUE, "$U$", "$C \\times d$", symmetric=True, bold=True)
    x += r + gap / 2
    _operator(ax, x, y + C / 2, "=")
    x += gap / 2
    style.matrix_block(
        ax, x, y, right, style.VALUE, r"$\operatorname{diag}(\beta)(V - KS)$", "$C \\times d$",
        symmetric=True,
    )  # fmt: skip
    ax.text(
        x + r + 1.2,
        y + C / 2,
        "$L_{ti} = \\beta_t\\, k_t^\\top k_i$ for $i < t$\n\nforward substitution:\n"
        "about $C^2 d$ operations",
        fontsize=12,
        va="center",
    )
    # Step 2: chunked linear attention with U in place of V.
    y = 6.5
    ax.text(
        0,
        y + C + 2.2,
        "2.  Output: chunked linear attention with $U$ in place of $V$",
        fontsize=13,
        color=style.QUERY,
    )
    x = 0.0
    for index, (data, color, label, shape, bold) in enumerate(
        (
            (O, style.INK, "$O$", "$C \\times d$", False),
            (q @ S, style.STATE, "$QS$", "$C \\times d$", False),
            (masked, style.SCORE, "$QK^\\top \\odot L_C$", "$C \\times C$", False),
            (U, style.VALUE, "$U$", "$C \\times d$", True),
        )
    ):
        rows, cols = data.shape
        style.matrix_block(ax, x, y, data, color, label, shape, symmetric=True, bold=bold)
        x += cols + gap / 2
        if index < 3:
            _operator(ax, x, y + C / 2, ("=", "+", "·")[index])
        x += gap / 2
    # Step 3 and the checks.
    y = 2.2
    ax.text(
        0,
        y,
        "3.  State: $S \\leftarrow S + K^\\top U$. The product of the chunk's $C$ transitions is\n"
        "     $I - K^\\top T K$ with $T = (I + L)^{-1} \\operatorname{diag}(\\beta)$: the WY form.",
        fontsize=13,
        color=style.STATE,
        va="center",
    )
    ax.text(
        0,
        y - 2.6,
        f"Computed: chunks against the recurrence, largest difference {chunk_error:.1e};\n"
        f"WY form against the product of transitions, {wy_error:.1e}.",
        fontsize=12,
        va="center",
    )
    ax.set_xlim(-2.5, 33.5)
    ax.set_ylim(-2.0, 40.5)
    return style.save(fig, out_dir, "chunked-delta")
