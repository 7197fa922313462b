"""Figure 4: the softmax and linear attention matrices of the same queries and keys (spec 6.1, 6.2).

The matrices are ``reference.attention_maps(np.random.default_rng(1))``, the spec's P4 and A4; the
ranks, the mean peak weights and the singular values are computed from them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn import reference
from linattn.figures import style

CAPTION = (
    "Figure 4. The same queries and keys through two kernels: the softmax matrix has full rank and "
    "sharp rows; the linear one has rank r and flat rows."
)

# Singular values below this are zero up to rounding (the spec's appendix uses the same cut).
ZERO = 1e-12


def attention_maps(
    out_dir: Path | str, seed: int = 1, n: int = 16, d: int = 4, scale: float = 1.5
) -> list[Path]:
    """Figure 4: heat maps of P (softmax) and A (elu + 1 features), and their singular values.

    Both are n x n; elu + 1 keeps r = d features (the spec: n = 16, d = 4, scale 1.5, seed 1).
    """
    plt = style.pyplot()
    P, A = reference.attention_maps(np.random.default_rng(seed), n=n, d=d, scale=scale)
    fig = plt.figure(figsize=(13, 4.4))
    grid = fig.add_gridspec(1, 5, width_ratios=[1, 1, 0.06, 0.12, 1.3], wspace=0.35)
    top = max(float(P.max()), float(A.max()))
    for column, (name, M) in enumerate((("softmax P", P), ("linear A (elu + 1)", A))):
        ax = fig.add_subplot(grid[0, column])
        image = ax.imshow(M, cmap=style.CMAP, vmin=0, vmax=top, interpolation="nearest")
        ax.set_title(
            f"{name}: rank {reference.matrix_rank(M)}\n"
            f"mean largest weight of a row {reference.mean_peak_weight(M):.2f}",
            fontsize=10.5,
        )
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        ax.set_xticks([0, n - 1], [1, n])
        ax.set_yticks([0, n - 1], [1, n])
    fig.colorbar(image, cax=fig.add_subplot(grid[0, 2]), label="attention weight")
    ax = fig.add_subplot(grid[0, 4])  # column 3 is a spacer for the colour bar's label
    spectra = [
        (name, np.linalg.svd(M, compute_uv=False), color, marker)
        for name, M, color, marker in (
            ("softmax", P, style.KEY, "o"),
            ("linear", A, style.STATE, "s"),
        )
    ]
    # Zero singular values cannot sit on a log axis: draw them as crosses on a floor below all
    # the nonzero ones.
    floor = min(float(sv[sv > ZERO].min()) for _, sv, _, _ in spectra) / 10
    for name, sv, color, marker in spectra:
        nonzero = sv[sv > ZERO]
        ax.semilogy(
            np.arange(1, len(nonzero) + 1),
            nonzero,
            marker=marker,
            color=color,
            label=f"{name}: {len(nonzero)} nonzero",
        )
        zeros = np.arange(len(nonzero) + 1, len(sv) + 1)
        if len(zeros):
            ax.semilogy(
                zeros,
                np.full(len(zeros), floor),
                marker="x",
                ls="none",
                color=color,
                label=f"{name}: {len(zeros)} zero (below {ZERO:g})",
            )
    ax.set_xlabel("index of the singular value")
    ax.set_ylabel("singular value")
    ax.set_title(f"Singular values (n = {n}, d = r = {d})", fontsize=10.5)
    ax.set_xticks([1, 4, 8, 12, 16])
    ax.legend(fontsize=8.5, frameon=False, loc="upper right")
    return style.save(fig, out_dir, "attention-maps")
