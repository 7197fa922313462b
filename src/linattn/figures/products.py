"""Figures 1 and 2: softmax attention as two products (spec section 2) and the two orders (4).

The matrices are drawn from their computed entries: random queries, keys and values through
``linattn.reference``, one square per entry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn import reference
from linattn.figures import style

SOFTMAX_CAPTION = (
    "Figure 1. Softmax attention is two matrix products around a row-wise softmax, and both pass "
    "through an n × n matrix."
)
REORDERING_CAPTION = (
    "Figure 2. The same product in two orders: an n × n matrix first, or an r × d matrix first."
)


def _example(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((n, d)) for _ in range(3))
    return Q, K, V


def _operator(ax, x: float, y: float, symbol: str) -> None:
    ax.text(x, y, symbol, ha="center", va="center", fontsize=18, color=style.INK)


def softmax_products(out_dir: Path | str, n: int = 8, d: int = 3, seed: int = 0) -> list[Path]:
    """Figure 1: Q K^T / sqrt(d) = G, P = softmax(G) row by row, O = P V (spec section 2).

    Q, K, V are n x d; G and P are n x n. P and O come from ``reference.softmax_attention``.
    """
    plt = style.pyplot()
    Q, K, V = _example(n, d, seed)
    O, P = reference.softmax_attention(Q, K, V)
    G = Q @ K.T / np.sqrt(d)  # the scores, shown before the softmax
    fig = plt.figure(figsize=(10.8, 3.6))
    ax = style.blank_axes(fig)
    gap, x = 1.6, 0.0
    style.matrix_block(ax, x, 0, Q, style.QUERY, "$Q$", r"$n \times d$", symmetric=True)
    x += d + gap / 2
    _operator(ax, x, n / 2, "·")
    x += gap / 2
    style.matrix_block(
        ax, x, (n - d) / 2, K.T, style.KEY, r"$K^\top / \sqrt{d}$", r"$d \times n$", symmetric=True
    )
    x += n + gap / 2
    _operator(ax, x, n / 2, "=")
    x += gap / 2
    style.matrix_block(
        ax,
        x,
        0,
        G,
        style.SCORE,
        "$G$ (scores)",
        r"$n \times n$: $2n^2d$ operations",
        symmetric=True,
        bold=True,
    )
    x += n
    style.arrow(ax, (x + 0.6, n / 2), (x + 4.4, n / 2), "softmax\nof each row")
    x += 5
    style.matrix_block(ax, x, 0, P, style.SCORE, "$P$", r"$n \times n$, rows sum to 1", bold=True)
    x += n + gap / 2
    _operator(ax, x, n / 2, "·")
    x += gap / 2
    style.matrix_block(ax, x, 0, V, style.VALUE, "$V$", r"$n \times d$", symmetric=True)
    x += d + gap / 2
    _operator(ax, x, n / 2, "=")
    x += gap / 2
    style.matrix_block(
        ax, x, 0, O, style.INK, "$O$", "$n \\times d$\n$2n^2d$ operations", symmetric=True
    )
    ax.set_xlim(-0.5, x + d + 0.5)
    ax.set_ylim(-2.6, n + 1.6)
    return style.save(fig, out_dir, "softmax-attention-products")


def reordering(out_dir: Path | str, n: int = 12, r: int = 4, seed: int = 1) -> list[Path]:
    """Figure 2: (phi(Q) phi(K)^T) V against phi(Q) (phi(K)^T V) (spec section 4).

    phi = elu + 1, so r = d. The left order builds the n x n matrix A, the right order the r x d
    matrix M; the largest difference of the two outputs (``reference.linear_attention_quadratic``
    against ``reference.linear_attention``) is printed in the figure.
    """
    plt = style.pyplot()
    Q, K, V = _example(n, r, seed)
    FQ, FK = reference.elu_plus_one(Q), reference.elu_plus_one(K)
    A, M = FQ @ FK.T, FK.T @ V  # the two intermediates: n x n, r x d
    left, _ = reference.linear_attention_quadratic(Q, K, V)
    right = reference.linear_attention(Q, K, V)
    difference = float(np.abs(left - right).max())
    fig = plt.figure(figsize=(11, 8.0))
    ax = style.blank_axes(fig)
    top = n + 5.0
    ax.text(
        0, top + n + 2.2, r"Left order: $(\phi(Q)\,\phi(K)^\top)\,V$, an $n \times n$ matrix first",
        fontsize=14,
    )  # fmt: skip
    x = _product_row(
        ax,
        top,
        [
            (FQ, style.QUERY, r"$\phi(Q)$", r"$n \times r$", False),
            (FK.T, style.KEY, r"$\phi(K)^\top$", r"$r \times n$", False),
            (A, style.SCORE, "$A$", r"$n \times n$: $2n^2r$ operations", True),
        ],
        n,
    )
    x = _then(ax, x, top, n)
    right_edge = _product_row(
        ax,
        top,
        [
            (None, style.SCORE, "$A$", "", False),  # A again, as its name: drawn once above
            (V, style.VALUE, "$V$", r"$n \times d$", False),
            (left, style.INK, "$O$", "$2n^2d$ operations", False),
        ],
        n,
        x0=x,
    )
    ax.text(
        0, n + 2.2, r"Right order: $\phi(Q)\,(\phi(K)^\top V)$, an $r \times d$ matrix first",
        fontsize=14,
    )  # fmt: skip
    x = _product_row(
        ax,
        0.0,
        [
            (FK.T, style.KEY, r"$\phi(K)^\top$", r"$r \times n$", False),
            (V, style.VALUE, "$V$", r"$n \times d$", False),
            (M, style.STATE, "$M$", r"$r \times d$: $2nrd$", True),
        ],
        n,
    )
    x = _then(ax, x, 0.0, n)
    x = _product_row(
        ax,
        0.0,
        [
            (FQ, style.QUERY, r"$\phi(Q)$", r"$n \times r$", False),
            (None, style.STATE, "$M$", "", False),
            (right, style.INK, "$O$", "$2nrd$ operations", False),
        ],
        n,
        x0=x,
    )
    ax.text(
        0,
        -2.6,
        rf"$n = {n}$, $r = d = {r}$, $\phi$ = elu + 1. Both orders give the same $O$ (rows divided "
        rf"by the normaliser $z = \phi(K)^\top 1$): largest difference {difference:.1e}.",
        fontsize=11,
        ha="left",
        va="top",
        color=style.INK,
    )
    ax.set_xlim(-0.5, max(right_edge, x) + 0.5)
    ax.set_ylim(-3.6, 2 * n + 8.4)
    return style.save(fig, out_dir, "reordering")


def _product_row(ax, y: float, blocks, n: int, x0: float = 0.0) -> float:
    """Draw ``X · Y = Z``, each block centred on a row of height n; return where it ends.

    A block whose data is None is a matrix already drawn: it is written as its name.
    """
    gap, x = 1.6, x0
    for index, (data, color, label, shape, bold) in enumerate(blocks):
        if data is None:
            ax.text(x + 0.8, y + n / 2, label, ha="center", va="center", fontsize=20, color=color)
            x += 1.6
        else:
            rows, cols = data.shape
            style.matrix_block(
                ax,
                x,
                y + (n - rows) / 2,
                data,
                color,
                label,
                shape,
                bold=bold,
                symmetric=bool((data < 0).any()),
            )
            x += cols
        if index < len(blocks) - 1:
            _operator(ax, x + gap / 2, y + n / 2, "·" if index == 0 else "=")
            x += gap
    return x


def _then(ax, x: float, y: float, n: int) -> float:
    """An arrow between the two products of one order; returns where the next product starts."""
    style.arrow(ax, (x + 0.5, y + n / 2), (x + 3.3, y + n / 2), "then")
    return x + 3.8
