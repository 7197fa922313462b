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

# name, citation, update rule (matplotlib mathtext), (column, row) in the lattice: the columns are
# the rule (additive, delta), the rows what the memory forgets (nothing, one rate, one per channel).
METHODS = {
    "linear": (
        "Linear attention",
        "Katharopoulos et al. 2020",
        r"$S_t = S_{t-1} + k_t v_t^\top$",
        (0, 0),
    ),
    "deltanet": (
        "DeltaNet (delta rule)",
        "Schlag et al. 2021; Yang et al. 2024b",
        r"$S_t = (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$",
        (1, 0),
    ),
    "mamba2": (
        "Mamba-2 (scalar decay)",
        "Dao and Gu 2024",
        r"$S_t = \alpha_t S_{t-1} + k_t v_t^\top$",
        (0, 1),
    ),
    "gated_deltanet": (
        "Gated DeltaNet",
        "Yang, Kautz and Hatamizadeh 2025",
        r"$S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$",
        (1, 1),
    ),
    "gla": (
        "GLA (per-channel decay)",
        "Yang et al. 2024a",
        r"$S_t = \mathrm{Diag}(\alpha_t) S_{t-1} + k_t v_t^\top$",
        (0, 2),
    ),
    "kda": (
        "Kimi Delta Attention",
        "Kimi Team 2025",
        r"$S_t = (I - \beta_t k_t k_t^\top)\,\mathrm{Diag}(\alpha_t) S_{t-1}"
        r" + \beta_t k_t v_t^\top$",
        (1, 2),
    ),
}
DELTA = "read, correct,\nwrite"
EDGES = [
    ("linear", "deltanet", DELTA),
    ("mamba2", "gated_deltanet", DELTA),
    ("gla", "kda", DELTA),
    ("linear", "mamba2", r"forget: one rate $\alpha_t$"),
    ("deltanet", "gated_deltanet", r"forget: one rate $\alpha_t$"),
    ("mamba2", "gla", "one rate per channel"),
    ("gated_deltanet", "kda", "one rate per channel"),
]
# The drawing is in inches: columns of boxes (x, width), rows (top y), box height.
COLUMNS = ((0.0, 2.95), (4.25, 4.35))
ROW_TOP, ROW_STEP, BOX_HEIGHT = 6.3, 1.95, 1.2
HYBRID_X, HYBRID_WIDTH = 9.15, 1.95
HYBRID_PATTERN = ("KDA", "KDA", "KDA", "full attention")  # Kimi Linear, repeated through depth


def _corner(name: str) -> tuple[float, float, float]:
    """(x, y of the lower-left corner, width) of a method's box."""
    column, row = METHODS[name][3]
    x, width = COLUMNS[column]
    return x, ROW_TOP - row * ROW_STEP - BOX_HEIGHT, width


def _box(ax, name: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    title, citation, rule, _ = METHODS[name]
    x, y, width = _corner(name)
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            width,
            BOX_HEIGHT,
            boxstyle="round,pad=0.02,rounding_size=0.1",
            facecolor="#f6f2fb",
            edgecolor=style.STATE,
            lw=1.4,
        )
    )
    middle = x + width / 2
    ax.text(middle, y + BOX_HEIGHT - 0.22, title, ha="center", va="center", fontsize=12,
            weight="bold", color=style.INK)  # fmt: skip
    ax.text(middle, y + BOX_HEIGHT / 2 - 0.04, rule, ha="center", va="center", fontsize=12.5)
    ax.text(middle, y + 0.2, citation, ha="center", va="center", fontsize=10, color=style.SCORE)


def _edge(ax, start: str, end: str, text: str) -> None:
    """A horizontal arrow (the delta rule) with its label above, or a vertical one (decay) with
    its label beside it; every arrow is labelled and no label covers an arrow."""
    x0, y0, w0 = _corner(start)
    x1, y1, w1 = _corner(end)
    if y0 == y1:
        a, b = (x0 + w0 + 0.08, y0 + BOX_HEIGHT / 2), (x1 - 0.08, y1 + BOX_HEIGHT / 2)
        label, align = ((a[0] + b[0]) / 2, a[1] + 0.1), {"ha": "center", "va": "bottom"}
    else:
        a, b = (x0 + w0 / 2, y0 - 0.06), (x1 + w1 / 2, y1 + BOX_HEIGHT + 0.06)
        label, align = (a[0] + 0.12, (a[1] + b[1]) / 2), {"ha": "left", "va": "center"}
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.3})
    ax.text(*label, text, fontsize=11, color=style.INK, **align)


def series_roadmap(out_dir: Path | str, d: int = 128, t: int = 131_072) -> list[Path]:
    """Figure 9: the update rules as a lattice from linear attention to Kimi Delta Attention (the
    delta rule to the right, decay downwards), and the hybrid of three KDA layers to one
    full-attention layer, with its memory at step ``t`` (r = d)."""
    plt = style.pyplot()
    fig = plt.figure(figsize=(11.1, 6.9))
    ax = style.blank_axes(fig)
    for name in METHODS:
        _box(ax, name)
    for start, end, text in EDGES:
        _edge(ax, start, end, text)
    fraction, smaller = _hybrid(ax, d, t)
    ax.text(
        HYBRID_X + HYBRID_WIDTH / 2,
        ROW_TOP - ROW_STEP - 0.3 - 8 * 0.41 - 0.08,
        f"memory at $t$ = {t:,},\n$d = r = {d}$:\n{fraction:.1%} of\nall-full-attention\n"
        f"(KV cache {smaller:.0%} smaller)",
        ha="center",
        va="top",
        fontsize=10.5,
        color=style.KEY,
    )
    ax.text(
        0.0,
        0.95,
        r"One $r \times d$ memory per head, read as $o_t = S_t^\top q_t$. $\alpha_t$: forget rate "
        "in (0, 1], a number or one per channel;\n"
        r"$\beta_t$: write strength; keys of unit length for the delta rules. "
        "Notation of Kimi Team (2025).",
        fontsize=11,
        va="top",
    )
    ax.set_xlim(-0.1, 11.15)
    ax.set_ylim(-0.4, 6.45)
    return style.save(fig, out_dir, "series-roadmap")


def _hybrid(ax, d: int, t: int) -> tuple[float, float]:
    """The stack of layers, one in four with full attention and its KV cache, fed by KDA; returns
    (its memory as a fraction of all-full-attention, how much smaller the KV cache is)."""
    layers = HYBRID_PATTERN * 2
    height, gap, top = 0.34, 0.07, ROW_TOP - ROW_STEP - 0.3
    for i, layer in enumerate(layers):
        full = layer == "full attention"
        y = top - (i + 1) * (height + gap)
        ax.add_patch(
            style._rectangle(
                (HYBRID_X, y),
                HYBRID_WIDTH,
                height,
                style.KEY if full else style.STATE,
                fill="#fdf0e2" if full else "#f6f2fb",
            )
        )
        ax.text(HYBRID_X + HYBRID_WIDTH / 2, y + height / 2, layer, ha="center", va="center",
                fontsize=10.5)  # fmt: skip
    ax.text(HYBRID_X + HYBRID_WIDTH / 2, top + 0.05, "Hybrid (Kimi Linear):\n3 KDA layers to 1\n"
            "of full attention", ha="center", va="bottom", fontsize=11, weight="bold")  # fmt: skip
    x, y, width = _corner("kda")
    ax.annotate(
        "",
        xy=(HYBRID_X - 0.06, y + BOX_HEIGHT / 2),
        xytext=(x + width + 0.06, y + BOX_HEIGHT / 2),
        arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.3},
    )
    cache = reference.kv_cache_numbers(t, d)
    state = reference.delta_state_numbers(d, d)
    full_layers = layers.count("full attention")
    hybrid = full_layers * cache + (len(layers) - full_layers) * state
    return hybrid / (len(layers) * cache), 1 - full_layers / len(layers)
