"""Figure 9: the roadmap, every method's update rule in one notation, and the hybrid (spec 10).

The update rules are those of DESIGN.md's table, S_t = A_t S_{t-1} + k_t w_t^T, written in the
notation of Kimi Team (2025). The hybrid's memory is computed from the cost model of
``linattn.reference`` (``kv_cache_numbers``, ``delta_state_numbers``).
"""

from __future__ import annotations

from pathlib import Path

from linattn import reference
from linattn.figures import style

CAPTION = (
    "Figure 9. The recurrent methods keep one r × d memory and change its update; the hybrid adds "
    "back a few full-attention layers."
)

# name, citation, update rule (matplotlib mathtext), lower-left corner of the box.
METHODS = {
    "linear": (
        "Linear attention",
        "Katharopoulos et al. 2020",
        r"$S_t = S_{t-1} + k_t v_t^\top$",
        (0.0, 4.2),
    ),
    "deltanet": (
        "DeltaNet (delta rule)",
        "Schlag et al. 2021; Yang et al. 2024b",
        r"$S_t = (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$",
        (7.8, 7.2),
    ),
    "mamba2": (
        "Mamba-2 (scalar decay)",
        "Dao and Gu 2024",
        r"$S_t = \alpha_t S_{t-1} + k_t v_t^\top$",
        (7.8, 1.2),
    ),
    "gated_deltanet": (
        "Gated DeltaNet",
        "Yang, Kautz and Hatamizadeh 2025",
        r"$S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$",
        (15.6, 7.2),
    ),
    "gla": (
        "GLA (per-channel decay)",
        "Yang et al. 2024a",
        r"$S_t = \mathrm{Diag}(\alpha_t) S_{t-1} + k_t v_t^\top$",
        (15.6, 1.2),
    ),
    "kda": (
        "Kimi Delta Attention",
        "Kimi Team 2025",
        r"$S_t = (I - \beta_t k_t k_t^\top)\,\mathrm{Diag}(\alpha_t) S_{t-1}"
        r" + \beta_t k_t v_t^\top$",
        (23.4, 4.2),
    ),
}
EDGES = [
    ("linear", "deltanet", "read, correct, write"),
    ("linear", "mamba2", "forget: one rate αₜ"),
    ("deltanet", "gated_deltanet", "forget:\none rate αₜ"),
    ("mamba2", "gated_deltanet", ""),
    ("mamba2", "gla", "one rate\nper channel"),
    ("gated_deltanet", "kda", "one rate per channel"),
    ("gla", "kda", ""),
]
BOX = (5.6, 1.9)  # width, height of a method's box
HYBRID_PATTERN = ("KDA", "KDA", "KDA", "full attention")  # Kimi Linear, repeated through depth


def _box(ax, name: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    title, citation, rule, (x, y) = METHODS[name]
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            *BOX,
            boxstyle="round,pad=0.05,rounding_size=0.25",
            facecolor="#f6f2fb",
            edgecolor=style.STATE,
            lw=1.4,
        )
    )
    ax.text(
        x + BOX[0] / 2,
        y + BOX[1] - 0.35,
        title,
        ha="center",
        va="center",
        fontsize=11,
        weight="bold",
        color=style.INK,
    )
    ax.text(x + BOX[0] / 2, y + BOX[1] / 2 - 0.05, rule, ha="center", va="center", fontsize=9.5)
    ax.text(
        x + BOX[0] / 2, y + 0.3, citation, ha="center", va="center", fontsize=8, color=style.SCORE
    )


def _edge(ax, start: str, end: str, text: str) -> None:
    (x0, y0), (x1, y1) = METHODS[start][3], METHODS[end][3]
    a = (x0 + BOX[0] + 0.1, y0 + BOX[1] / 2)
    b = (x1 - 0.1, y1 + BOX[1] / 2)
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.2})
    if text:
        above = 0.15 if a[1] == b[1] else 0.0  # a horizontal arrow keeps its label above it
        ax.text(
            (a[0] + b[0]) / 2,
            (a[1] + b[1]) / 2 + above,
            text,
            ha="center",
            va="bottom" if above else "center",
            fontsize=9,
            color=style.INK,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5},
        )


def series_roadmap(out_dir: Path | str, d: int = 128, t: int = 131_072) -> list[Path]:
    """Figure 9: the update rules as a map from linear attention to Kimi Delta Attention, and
    the hybrid of three KDA layers to one full-attention layer, with its memory at step ``t``
    (r = d)."""
    plt = style.pyplot()
    fig = plt.figure(figsize=(17, 6.0))
    ax = style.blank_axes(fig)
    for name in METHODS:
        _box(ax, name)
    for start, end, text in EDGES:
        _edge(ax, start, end, text)
    # The hybrid: a stack of layers, one in four with full attention and its KV cache.
    x0, y0, width, height = 32.0, 1.2, 3.6, 0.72
    layers = HYBRID_PATTERN * 2
    for i, layer in enumerate(reversed(layers)):
        full = layer == "full attention"
        ax.add_patch(
            style._rectangle(
                (x0, y0 + i * (height + 0.15)),
                width,
                height,
                style.KEY if full else style.STATE,
                fill="#fdf0e2" if full else "#f6f2fb",
            )
        )
        ax.text(
            x0 + width / 2,
            y0 + i * (height + 0.15) + height / 2,
            layer,
            ha="center",
            va="center",
            fontsize=9,
        )
    ax.text(
        x0 + width / 2,
        y0 + len(layers) * (height + 0.15) + 0.2,
        "Hybrid (Kimi Linear)",
        ha="center",
        va="bottom",
        fontsize=11,
        weight="bold",
    )
    kda = METHODS["kda"][3]
    ax.annotate(
        "",
        xy=(x0 - 0.1, kda[1] + BOX[1] / 2),
        xytext=(kda[0] + BOX[0] + 0.1, kda[1] + BOX[1] / 2),
        arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.2},
    )
    ax.text(
        (x0 + kda[0] + BOX[0]) / 2,
        kda[1] + BOX[1] / 2 + 0.25,
        "3 : 1 with\nfull attention",
        ha="center",
        va="bottom",
        fontsize=9,
    )
    cache = reference.kv_cache_numbers(t, d)
    state = reference.delta_state_numbers(d, d)
    full_layers = layers.count("full attention")
    hybrid = full_layers * cache + (len(layers) - full_layers) * state
    fraction = hybrid / (len(layers) * cache)
    ax.text(
        x0 + width / 2,
        y0 - 0.25,
        f"memory at t = {t:,}, d = r = {d}:\n{fraction:.1%} of all-full-attention\n"
        f"(KV cache {1 - full_layers / len(layers):.0%} smaller)",
        ha="center",
        va="top",
        fontsize=9,
        color=style.KEY,
    )
    ax.text(
        0.0,
        -0.6,
        "One r × d memory per head, read as oₜ = Sₜᵀqₜ.  αₜ: forget rate in (0, 1] "
        "(a number, or one per channel); βₜ: write strength; keys of unit length for the "
        "delta rules.  Notation of Kimi Team (2025).",
        fontsize=9.5,
        va="top",
    )
    ax.set_xlim(-0.3, 36.0)
    ax.set_ylim(-1.8, 9.9)
    return style.save(fig, out_dir, "series-roadmap")
