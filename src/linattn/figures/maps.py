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
    fig = plt.figure(figsize=(11, 4.6))
    grid = fig.add_gridspec(1, 5, width_ratios=[1, 1, 0.06, 0.55, 1.25], wspace=0.25)
    top = max(float(P.max()), float(A.max()))
    for column, (name, M) in enumerate((("softmax $P$", P), ("linear $A$ (elu + 1)", A))):
        ax = fig.add_subplot(grid[0, column])
        image = ax.imshow(M, cmap=style.CMAP, vmin=0, vmax=top, interpolation="nearest")
        ax.set_title(
            f"{name}, rank {reference.matrix_rank(M)}\n"
            f"mean largest weight {reference.mean_peak_weight(M):.2f}",
            fontsize=11,
        )
        ax.set_xlabel("key $j$")
        if column == 0:
            ax.set_ylabel("query $i$")
        ax.set_xticks([0, n - 1], [1, n])
        ax.set_yticks([0, n - 1], [1, n])
    bar = fig.colorbar(image, cax=fig.add_subplot(grid[0, 2]))
    bar.set_label("attention weight", fontsize=11)
    uniform = 1 / n  # the weight of every entry of a uniform row, section 6.2
    bar.ax.axhline(uniform, color=style.ERROR, lw=2)
    ticks = [0.0, uniform, *np.arange(0.2, top, 0.2)]
    bar.set_ticks(ticks, labels=[f"{t:.1f}" if t != uniform else "" for t in ticks])
    bar.ax.text(
        1.6, uniform, f"{uniform:.4f}: uniform row", color=style.ERROR, fontsize=10,
        va="center", transform=bar.ax.get_yaxis_transform(),
    )  # fmt: skip
    _singular_values(fig.add_subplot(grid[0, 4]), P, A, n, d)  # column 3: the bar's label
    return style.save(fig, out_dir, "attention-maps")


def _singular_values(ax, P: np.ndarray, A: np.ndarray, n: int, d: int) -> None:
    """The singular values of P and A on a log axis; the zero ones counted in a note."""
    zeros = []
    # The two first singular values lie close together: the linear squares are hollow and drawn
    # under the softmax dots, so that neither marker hides the other.
    for name, M, color, marker, fill, z in (
        ("softmax", P, style.KEY, "o", "full", 3),
        ("linear", A, style.STATE, "s", "none", 2),
    ):
        sv = np.linalg.svd(M, compute_uv=False)
        nonzero = sv[sv > ZERO]
        ax.semilogy(
            np.arange(1, len(nonzero) + 1),
            nonzero,
            marker=marker,
            color=color,
            fillstyle=fill,
            markersize=8 if fill == "none" else 6,
            markeredgewidth=1.6,
            zorder=z,
            label=f"{name}: {len(nonzero)} nonzero",
        )
        zeros.append((name, len(sv) - len(nonzero), color))
    # A zero singular value has no place on a log axis: say how many there are instead.
    note = "; ".join(f"{name}: {count} zero" for name, count, _ in zeros if count)
    ax.text(
        0.04, 0.04, f"{note}\nsingular values\n(below {ZERO:g}:\nnot on a log axis)",
        transform=ax.transAxes, fontsize=10, color=style.STATE, va="bottom", ha="left",
    )  # fmt: skip
    ax.set_xlabel("index of the singular value")
    ax.set_ylabel("singular value")
    ax.set_title(f"Singular values ($n = {n}$, $d = r = {d}$)", fontsize=11)
    ax.set_xticks([1, 4, 8, 12, 16])
    ax.set_xlim(0.5, n + 0.5)
    ax.set_ylim(top=10)
    ax.legend(frameon=False, loc="upper right")
