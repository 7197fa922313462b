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
    fig = plt.figure(figsize=(13, 3.9))
    plane = fig.add_axes((0.02, 0.12, 0.2, 0.76))
    for i, key in enumerate(keys):
        color = style.ERROR if i == 2 else style.KEY
        plane.annotate(
            "", xy=key, xytext=(0, 0), arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2}
        )
        plane.text(
            key[0] + 0.06,
            key[1] + 0.06,
            f"k{i + 1} = {_vector_text(key)}",
            color=color,
            fontsize=10,
        )
    plane.set_xlim(-0.2, 1.8)
    plane.set_ylim(-0.2, 1.5)
    plane.set_aspect("equal")
    plane.set_title("the keys: k1 ⊥ k2, k3 overlaps both", fontsize=10)
    plane.set_xticks([0, 1])
    plane.set_yticks([0, 1])

    ax = style.blank_axes(fig, (0.25, 0.0, 0.75, 1.0))
    x = 0.0
    for t, S in enumerate(states, start=1):
        style.value_grid(ax, x, 0.5, S, style.STATE, f"S{t}")
        ax.text(
            x + 1,
            0.1,
            f"+ k{t} v{t}ᵀ, v{t} = {_vector_text(values[t - 1])}",
            ha="center",
            va="top",
            fontsize=9,
            color=style.INK,
        )
        if t < 3:
            style.arrow(ax, (x + 2.3, 1.5), (x + 3.3, 1.5))
        x += 3.6
    x += 0.8
    crosstalk = example["crosstalk"]
    for label, M, color, highlight in (
        ("stored vᵢ", values, style.VALUE, None),
        ("read kᵢᵀS3 / |kᵢ|²", example["reads"], style.INK, None),
        ("crosstalk", crosstalk, style.ERROR, np.abs(crosstalk) > 0),
    ):
        style.value_grid(ax, x, 0.0, M, color, label, highlight=highlight)
        x += 3.2
    for i in range(3):
        ax.text(x - 3.2 * 3 - 0.3, 2.5 - i, f"i = {i + 1}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.3, x)
    ax.set_ylim(-0.8, 3.8)
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
    fig = plt.figure(figsize=(13, 5.2))
    ax = style.blank_axes(fig)
    rows = {"additive": 4.2, "delta": 0.0}
    for name, y in rows.items():
        ax.text(
            -0.4,
            y + 1.0,
            "additive rule" if name == "additive" else "delta rule (β = 1)",
            ha="right",
            va="center",
            fontsize=12,
        )
        style.value_grid(ax, 0, y, S2, style.STATE, "S2")
    # Additive: write k3 v3^T on top of what k1 stored.
    y = rows["additive"]
    style.arrow(ax, (2.3, y + 1), (5.7, y + 1), f"+ k3 v3ᵀ, v3 = {_vector_text(values[2])}")
    style.value_grid(ax, 6, y, example["additive_S3"], style.STATE, "S3")
    style.arrow(ax, (8.3, y + 1), (10.7, y + 1), "read k3ᵀS3")
    style.value_grid(
        ax, 11, y + 0.5, additive_read[None], style.ERROR, "read", highlight=np.ones((1, 2), bool)
    )
    ax.text(
        13.4,
        y + 1,
        f"= v1 + v3: the old value {_vector_text(values[0])} stays",
        va="center",
        fontsize=11,
        color=style.ERROR,
    )
    # Delta: read, correct, write the difference.
    y = rows["delta"]
    style.arrow(ax, (2.3, y + 1), (3.7, y + 1), "read")
    style.value_grid(ax, 4, y + 0.5, old_read[None], style.INK, "k3ᵀS2")
    style.arrow(ax, (6.3, y + 1), (7.7, y + 1), "correct")
    style.value_grid(ax, 8, y + 0.5, example["u3"][None], style.VALUE, "u3 = v3 − k3ᵀS2")
    style.arrow(ax, (10.3, y + 1), (11.7, y + 1), "+ k3 u3ᵀ")
    style.value_grid(ax, 12, y, example["delta_S3"], style.STATE, "S3")
    style.arrow(ax, (14.3, y + 1), (16.7, y + 1), "read k3ᵀS3")
    style.value_grid(ax, 17, y + 0.5, delta_read[None], style.VALUE, "read")
    ax.text(
        19.4,
        y + 1,
        f"= v3 {_vector_text(v3[0])}: only the new value",
        va="center",
        fontsize=11,
        color=style.VALUE,
    )
    ax.text(
        0,
        -1.3,
        f"keys k1 = k3 = {_vector_text(keys[0])}, k2 = {_vector_text(keys[1])}; "
        f"values v1 = {_vector_text(values[0])}, v2 = {_vector_text(values[1])}, "
        f"v3 = {_vector_text(values[2])}",
        fontsize=10,
        va="top",
    )
    ax.set_xlim(-4.2, 25.5)
    ax.set_ylim(-2.0, 7.2)
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
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.1]})
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
        ax.text(*(-1.2 * normal + 0.1 * k), "k⊥", color=style.SCORE, fontsize=10)
        # The hyperplane of one equation, k^T x = v (the Kaczmarz view of section 7.2).
        ax.text(
            *(v * k - 0.9 * normal + 0.15 * k),
            f"kᵀx = {v:g}",
            color=style.VALUE,
            fontsize=10,
            rotation=np.degrees(angle) - 90,
            ha="center",
            va="center",
        )
        ax.annotate(
            "", xy=k, xytext=(0, 0), arrowprops={"arrowstyle": "-|>", "color": style.KEY, "lw": 2}
        )
        ax.text(*(k * 1.05 + np.array([0.0, -0.22])), "k", color=style.KEY, fontsize=12)
        for point, name, color, offset, align in (
            (s, "s", style.STATE, (0.0, 0.14), "center"),
            (moved, "A s", style.SCORE, (-0.12, -0.1), "right"),
            (new, "s new", style.VALUE, (0.12, 0.0), "left"),
        ):
            ax.plot(*point, "o", color=color, ms=7)
            ax.text(
                point[0] + offset[0],
                point[1] + offset[1],
                name,
                color=color,
                fontsize=11,
                ha=align,
                va="center",
            )
        ax.annotate(
            "",
            xy=moved,
            xytext=s,
            arrowprops={"arrowstyle": "-|>", "color": style.SCORE, "lw": 1.4},
        )
        ax.annotate(
            "",
            xy=new,
            xytext=moved,
            arrowprops={"arrowstyle": "-|>", "color": style.VALUE, "lw": 1.4},
        )
        ax.set_title(
            f"β = {beta:g}: kᵀs = {k @ s:.2f} → {k @ moved:.2f} → {k @ new:.2f}\n"
            f"the part along k⊥ stays {normal @ s:.2f}",
            fontsize=10.5,
        )
        ax.set_aspect("equal")
        ax.set_xlim(-1.6, 2.8)
        ax.set_ylim(-0.8, 2.8)
        ax.grid(True, color="#eeeeee")
    ax = axes[2]
    betas = np.linspace(0.0, 2.0, 81)
    direction = np.ones(8) / np.sqrt(8)  # any unit key in R^8 gives the same spectrum
    spectra = np.array([reference.householder_spectrum(direction, float(b)) for b in betas])
    ax.plot(betas, spectra[:, 1], color=style.SCORE, lw=2, label="largest eigenvalue")
    ax.plot(betas, spectra[:, 0], color=style.KEY, lw=2, label="smallest eigenvalue, 1 − β")
    ax.plot(betas, spectra[:, 2], color=style.STATE, lw=1.5, ls="--", label="spectral norm")
    for beta, name in ((1.0, "projection"), (2.0, "reflection")):
        ax.axvline(beta, color="#cccccc", lw=0.8)
        ax.text(beta - 0.03, 0.1, name, rotation=90, ha="right", va="bottom", fontsize=9)
    ax.set_xlabel("write strength β")
    ax.set_title("A = I − β k kᵀ in R⁸", fontsize=10.5)
    ax.set_ylim(-1.1, 1.25)
    ax.legend(fontsize=9, frameon=False, loc="lower left")
    fig.tight_layout()
    return style.save(fig, out_dir, "householder")
