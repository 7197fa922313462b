"""Figures 5, 6 and 7: writes into a small memory (spec sections 6.3, 7 and 7.2).

The states, reads, crosstalk and pseudo-values are those of ``reference.figure5_example``,
``reference.figure6_example`` and ``reference.delta_rule``; the geometry of Figure 7 is one step of
``reference.delta_rule`` from a given column, with the transition from
``reference.transition_product``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn import reference
from linattn.figures import style

INTERFERENCE_CAPTION = (
    "Figure 5. A worked example: two orthogonal keys are stored exactly, and the third key, "
    "(1, 1), adds crosstalk to every read."
)
OVERWRITE_CAPTION = (
    "Figure 6. A new value under an old key: the additive rule keeps the old value; the delta rule "
    "reads, corrects and writes, and keeps only the new one."
)
HOUSEHOLDER_CAPTION = (
    "Figure 7. One write, one column: the transition moves the column along the key, and the write "
    "sets its coordinate on the key."
)


def _vector_text(x: np.ndarray) -> str:
    return "(" + ", ".join(f"{style._clean(v):g}" for v in x) + ")"


def interference(out_dir: Path | str) -> list[Path]:
    """Figure 5: S_t = sum_{j <= t} k_j v_j^T for three writes into a 2 x 2 memory (section 6.3).

    Left: the keys in the plane. Middle: S_1, S_2, S_3. Right: the stored values, the reads
    k_i^T S_3 / |k_i|^2 and their crosstalk, nonzero entries in red.
    """
    plt = style.pyplot()
    example = reference.figure5_example()
    keys, values = example["keys"], example["values"]
    states = [np.outer(keys[0], values[0]), example["S2"], example["S3"]]
    fig = plt.figure(figsize=(11, 3.9))
    plane = fig.add_axes((0.03, 0.12, 0.19, 0.7))
    for i, key in enumerate(keys):
        color = style.ERROR if i == 2 else style.KEY
        plane.annotate(
            "", xy=key, xytext=(0, 0), arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2}
        )
        plane.text(
            key[0] + 0.06,
            key[1] + 0.06,
            f"$k_{i + 1}$ = {_vector_text(key)}",
            color=color,
            fontsize=11,
        )
    plane.set_xlim(-0.2, 2.0)
    plane.set_ylim(-0.2, 1.5)
    plane.set_aspect("equal")
    plane.set_title("the keys: $k_1 \\perp k_2$,\n$k_3$ overlaps both", fontsize=11)
    plane.set_xticks([0, 1])
    plane.set_yticks([0, 1])

    ax = style.blank_axes(fig, (0.25, 0.0, 0.75, 1.0))
    x = 0.0
    for t, S in enumerate(states, start=1):
        style.value_grid(ax, x, 0.5, S, style.STATE, f"$S_{t}$")
        ax.text(
            x + 1,
            0.1,
            f"$+\\,k_{t} v_{t}^\\top$\n$v_{t}$ = {_vector_text(values[t - 1])}",
            ha="center",
            va="top",
            fontsize=11,
            color=style.INK,
        )
        if t < 3:
            style.arrow(ax, (x + 2.2, 1.5), (x + 2.9, 1.5))
        x += 3.1
    x += 1.0
    crosstalk = example["crosstalk"]
    for label, M, color, highlight in (
        ("stored $v_i$", values, style.VALUE, None),
        ("read\n$k_i^\\top S_3 / \\|k_i\\|^2$", example["reads"], style.INK, None),
        ("crosstalk", crosstalk, style.ERROR, np.abs(crosstalk) > 0),
    ):
        style.value_grid(ax, x, 0.0, M, color, label, highlight=highlight)
        x += 3.0
    for i in range(3):
        ax.text(x - 3.0 * 3 - 0.2, 2.5 - i, f"$i = {i + 1}$", ha="right", va="center", fontsize=11)
    ax.set_xlim(-0.3, x - 0.8)
    ax.set_ylim(-1.3, 4.4)
    return style.save(fig, out_dir, "interference")


def overwrite(out_dir: Path | str) -> list[Path]:
    """Figure 6: a repeated key, k_3 = k_1, under the additive rule and the delta rule (section 7).

    Additive: S_3 = S_2 + k_3 v_3^T reads back v_1 + v_3. Delta (beta = 1): read k_3^T S_2,
    u_3 = v_3 - k_3^T S_2, S_3 = S_2 + k_3 u_3^T reads back v_3.
    """
    plt = style.pyplot()
    example = reference.figure6_example()
    keys, values = example["keys"], example["values"]
    _, S2 = reference.delta_rule(keys[:2], keys[:2], values[:2], np.ones(2))
    old_read = keys[2] @ S2
    additive_read = keys[2] @ example["additive_S3"]
    delta_read = keys[2] @ example["delta_S3"]
    v3 = values[2][None]
    fig = plt.figure(figsize=(11, 5.0))
    ax = style.blank_axes(fig)
    rows = {"additive": 4.6, "delta": 0.0}
    labels = {"additive": "additive rule", "delta": "delta rule\n($\\beta = 1$)"}
    for name, y in rows.items():
        ax.text(
            -0.4,
            y + 1.0,
            labels[name],
            ha="right",
            va="center",
            fontsize=13,
        )
        style.value_grid(ax, 0, y, S2, style.STATE, "$S_2$")
    # Additive: write k3 v3^T on top of what k1 stored.
    y = rows["additive"]
    style.arrow(ax, (2.3, y + 1), (5.7, y + 1), "$+\\,k_3 v_3^\\top$")
    style.value_grid(ax, 6, y, example["additive_S3"], style.STATE, "$S_3$")
    style.arrow(ax, (8.3, y + 1), (10.7, y + 1), "read $k_3^\\top S_3$")
    style.value_grid(
        ax, 11, y + 0.5, additive_read[None], style.ERROR, "read", highlight=np.ones((1, 2), bool)
    )
    ax.text(
        13.4,
        y + 1,
        f"$= v_1 + v_3$: the old value\n{_vector_text(values[0])} stays",
        va="center",
        fontsize=12,
        color=style.ERROR,
    )
    # Delta: read, correct, write the difference.
    y = rows["delta"]
    style.arrow(ax, (2.3, y + 1), (3.7, y + 1), "read")
    style.value_grid(ax, 4, y + 0.5, old_read[None], style.INK, "$k_3^\\top S_2$")
    style.arrow(ax, (6.3, y + 1), (7.7, y + 1), "correct")
    style.value_grid(ax, 8, y + 0.5, example["u3"][None], style.VALUE, "")
    ax.text(
        9, y + 0.3, "$u_3 = v_3 - S_2^\\top k_3$", ha="center", va="top", fontsize=12,
        color=style.VALUE,
    )  # fmt: skip
    style.arrow(ax, (10.3, y + 1), (11.7, y + 1), "$+\\,k_3 u_3^\\top$")
    style.value_grid(ax, 12, y, example["delta_S3"], style.STATE, "$S_3$")
    style.arrow(ax, (14.3, y + 1), (16.2, y + 1), "read")
    style.value_grid(ax, 16.5, y + 0.5, delta_read[None], style.VALUE, "read")
    ax.text(
        18.9,
        y + 1,
        f"$= v_3$ {_vector_text(v3[0])}:\nonly the new value",
        va="center",
        fontsize=12,
        color=style.VALUE,
    )
    ax.text(
        0,
        -1.1,
        f"keys $k_1 = k_3$ = {_vector_text(keys[0])}, $k_2$ = {_vector_text(keys[1])}; "
        f"values $v_1$ = {_vector_text(values[0])}, $v_2$ = {_vector_text(values[1])}, "
        f"$v_3$ = {_vector_text(values[2])}",
        fontsize=12,
        va="top",
    )
    ax.set_xlim(-4.4, 23.6)
    ax.set_ylim(-2.0, 7.8)
    return style.save(fig, out_dir, "overwrite")


def _column_step(k: np.ndarray, s: np.ndarray, v: float, beta: float):
    """One delta-rule step on one column: (A s, new s) with A = I - beta k k^T (section 7.2)."""
    A = reference.transition_product(k[None], np.array([beta]))
    _, S = reference.delta_rule(
        k[None], k[None], np.array([[v]]), np.array([beta]), initial_state=s[:, None]
    )
    return A @ s, S[:, 0]


def householder(
    out_dir: Path | str,
    angle: float = np.pi / 6,
    s: tuple[float, float] = (-0.2, 1.6),
    v: float = 2.0,
) -> list[Path]:
    """Figure 7: one delta-rule write on one column s of the state, for beta = 1 and beta = 0.5.

    The transition keeps the part of s orthogonal to k and scales k^T s by 1 - beta; the write adds
    beta v k, so k^T s_new = (1 - beta) k^T s + beta v. Right: the eigenvalues and the spectral norm
    of I - beta k k^T (``reference.householder_spectrum``) for beta in [0, 2].
    """
    plt = style.pyplot()
    k = np.array([np.cos(angle), np.sin(angle)])
    s = np.asarray(s, dtype=float)
    normal = np.array([-k[1], k[0]])  # spans the orthogonal complement of k
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1, 1, 0.9]})
    for ax, beta in zip(axes[:2], (1.0, 0.5), strict=True):
        moved, new = _column_step(k, s, v, beta)
        line = np.linspace(-2.4, 2.4, 2)
        ax.plot(line * normal[0], line * normal[1], color=style.SCORE, ls="--", lw=1)
        ax.plot(
            v * k[0] + line * normal[0],
            v * k[1] + line * normal[1],
            color=style.VALUE,
            ls=":",
            lw=1.5,
        )
        # Away from the axes and their tick labels: the upper end of the line k^T x = 0.
        ax.text(*(2.05 * normal - 0.12 * k), r"$k^\perp$", color=style.SCORE, fontsize=12,
                ha="right", va="center")  # fmt: skip
        # The hyperplane of one equation, k^T x = v (the Kaczmarz view of section 7.2).
        ax.text(
            *(v * k - 1.0 * normal + 0.2 * k),
            f"$k^\\top x = {v:g}$",
            color=style.VALUE,
            fontsize=11,
            rotation=np.degrees(angle) - 90,
            ha="center",
            va="center",
        )
        ax.annotate(
            "", xy=k, xytext=(0, 0), arrowprops={"arrowstyle": "-|>", "color": style.KEY, "lw": 2}
        )
        ax.text(*(k * 1.05 + np.array([0.05, -0.2])), "$k$", color=style.KEY, fontsize=13)
        _two_moves(ax, s, moved, new, normal)
        ax.set_title(
            f"$\\beta = {beta:g}$: $k^\\top s$ = {k @ s:.2f} → {k @ moved:.2f} → {k @ new:.2f}\n"
            f"along $k^\\perp$ it stays {normal @ s:.2f}",
            fontsize=11,
        )
        ax.set_aspect("equal")
        ax.set_xlim(-1.7, 2.8)
        ax.set_ylim(-0.8, 2.8)
        ax.grid(True, color="#eeeeee")
    _spectrum(axes[2])
    fig.tight_layout()
    return style.save(fig, out_dir, "householder")


def _spectrum(ax) -> None:
    """The eigenvalues and the spectral norm of I - beta k k^T in R^8 for beta in [0, 2]
    (``reference.householder_spectrum``)."""
    betas = np.linspace(0.0, 2.0, 81)
    direction = np.ones(8) / np.sqrt(8)  # any unit key in R^8 gives the same spectrum
    spectra = np.array([reference.householder_spectrum(direction, float(b)) for b in betas])
    # The largest eigenvalue and the spectral norm are both 1: a wide grey band under the dashed
    # norm, so that both lines show.
    ax.plot(betas, spectra[:, 1], color=style.SCORE, lw=7, alpha=0.45, solid_capstyle="butt",
            label="largest eigenvalue, 1")  # fmt: skip
    ax.plot(betas, spectra[:, 0], color=style.KEY, lw=2, label="smallest, $1 - \\beta$")
    ax.plot(betas, spectra[:, 2], color=style.STATE, lw=1.5, ls="--", label="spectral norm, 1")
    for beta, name in ((1.0, "projection"), (2.0, "reflection")):
        ax.axvline(beta, color="#cccccc", lw=0.8)
        ax.text(beta - 0.04, 0.15, name, rotation=90, ha="right", va="bottom", fontsize=10)
    ax.set_xlabel("write strength $\\beta$")
    ax.set_title("$A = I - \\beta\\, k k^\\top$ in $\\mathbb{R}^8$", fontsize=11)
    ax.set_ylim(-1.1, 1.25)
    ax.set_xticks([0, 0.5, 1, 1.5, 2])
    ax.legend(frameon=False, loc="lower left")


def _two_moves(ax, s: np.ndarray, moved: np.ndarray, new: np.ndarray, normal: np.ndarray) -> None:
    """The transition s -> A s and the write A s -> s_new, both along k: the write is drawn
    straight from A s to s_new, the transition bent to the side of it, so that the two moves
    stay apart and each arrow starts and ends on its points."""
    shift = -0.16 * normal
    ax.annotate(
        "", xy=moved, xytext=s, arrowprops={"arrowstyle": "-|>", "color": style.SCORE, "lw": 1.6,
                                            "connectionstyle": "arc3,rad=0.6", "shrinkA": 4,
                                            "shrinkB": 4},
    )  # fmt: skip
    ax.annotate(
        "",
        xy=new,
        xytext=moved,
        arrowprops={"arrowstyle": "-|>", "color": style.VALUE, "lw": 1.6, "shrinkA": 4,
                    "shrinkB": 5},
    )  # fmt: skip
    for point, name, color, offset, align in (
        (s, "$s$", style.STATE, (0.0, 0.16), "center"),
        (moved, "$A s$", style.SCORE, (-0.12, 0.1), "right"),
        (new, "$s_{new}$", style.VALUE, (0.12, 0.05), "left"),
    ):
        ax.plot(*point, "o", color=color, ms=7, zorder=3)
        ax.text(point[0] + offset[0], point[1] + offset[1], name, color=color, fontsize=12,
                ha=align, va="center")  # fmt: skip
    middle = (moved + new) / 2 + 2.2 * shift
    ax.text(*middle, "write", color=style.VALUE, fontsize=11, ha="left", va="top")
