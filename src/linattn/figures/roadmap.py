"""Figure 9: the roadmap, every method's update rule in one notation, and the hybrid (spec 10).

The update rules are those of the mechanism table (docs/design.md), S_t = A_t S_{t-1} + k_t w_t^T,
written in the notation of Kimi Team (2025). The hybrid's memory is computed from the cost model of
``linattn.reference`` (``kv_cache_numbers``, ``delta_state_numbers``).
"""

from __future__ import annotations

from pathlib import Path

from linattn import reference
from linattn.figures import style

CAPTION = (
    "Figure 9. The recurrent methods keep one r × d memory and change its update: the delta rule's "
    "transition is the identity less a rank-one matrix along the key, the generalized delta rule's "
    "a decay plus any rank-one matrix; the hybrid adds back a few full-attention layers."
)

# name, citation, update rule (matplotlib mathtext), (column, row) in the lattice: the columns are
# the rule (additive, delta, generalized delta: a diagonal-plus-rank-one transition), the rows what
# the memory forgets (nothing, one rate, one per channel).
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
    "iplr": (
        "IPLR (generalized delta rule)",
        "fla's generalized_delta_rule",
        r"$S_t = (I + a_t b_t^\top) S_{t-1} + k_t v_t^\top$",
        (2, 0),
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
    "comba": (
        "Comba (separate read key)",
        "Hu et al. 2025",
        r"$S_t = (\alpha_t I - \beta_t k_t p_t^\top) S_{t-1} + \beta_t k_t v_t^\top$",
        (2, 1),
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
    "dplr": (
        "DPLR / RWKV-7",
        "Peng et al. 2025; Gated DeltaNet-2",
        r"$S_t = (\mathrm{Diag}(\alpha_t) + a_t b_t^\top) S_{t-1} + k_t v_t^\top$",
        (2, 2),
    ),
}
DELTA = "read, correct,\nwrite"
RANK_ONE = "any rank-one\ncorrection\n" r"$a_t b_t^\top$"
EDGES = [
    ("linear", "deltanet", DELTA),
    ("mamba2", "gated_deltanet", DELTA),
    ("gla", "kda", DELTA),
    ("deltanet", "iplr", RANK_ONE),
    ("gated_deltanet", "comba", RANK_ONE),
    ("kda", "dplr", RANK_ONE),
    ("linear", "mamba2", r"forget: one rate $\alpha_t$"),
    ("deltanet", "gated_deltanet", r"forget: one rate $\alpha_t$"),
    ("iplr", "comba", r"forget: one rate $\alpha_t$"),
    ("mamba2", "gla", "one rate per channel"),
    ("gated_deltanet", "kda", "one rate per channel"),
    ("comba", "dplr", "one rate per channel"),
]
# The drawing is in inches: columns of boxes (x, width), rows (top y), box height; the hybrid is a
# row of layers under the lattice (its top y, one layer's width and the gap between layers).
COLUMNS = ((0.0, 2.35), (3.6, 3.25), (8.0, 3.05))
ROW_TOP, ROW_STEP, BOX_HEIGHT = 6.3, 1.95, 1.2
RULE_SIZE = 11.5
HYBRID_TOP, LAYER_WIDTH, LAYER_GAP, LAYER_HEIGHT = 0.45, 0.76, 0.07, 0.62
HYBRID_PATTERN = ("KDA", "KDA", "KDA", "full\nattention")  # Kimi Linear, repeated through depth


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
    ax.text(middle, y + BOX_HEIGHT / 2 - 0.04, rule, ha="center", va="center",
            fontsize=RULE_SIZE)  # fmt: skip
    ax.text(middle, y + 0.2, citation, ha="center", va="center", fontsize=10, color=style.SCORE)


def _edge(ax, start: str, end: str, text: str) -> None:
    """A horizontal arrow (the delta rule) with its label above, or a vertical one (decay) with
    its label beside it (on its left in the last column); every arrow is labelled and no label
    covers an arrow or a box."""
    x0, y0, w0 = _corner(start)
    x1, y1, w1 = _corner(end)
    if y0 == y1:
        a, b = (x0 + w0 + 0.08, y0 + BOX_HEIGHT / 2), (x1 - 0.08, y1 + BOX_HEIGHT / 2)
        label, align = ((a[0] + b[0]) / 2, a[1] + 0.1), {"ha": "center", "va": "bottom"}
    else:
        a, b = (x0 + w0 / 2, y0 - 0.06), (x1 + w1 / 2, y1 + BOX_HEIGHT + 0.06)
        # beside the arrow, on its left in the last column (the figure ends at that column's box)
        last = METHODS[start][3][0] == len(COLUMNS) - 1
        side = (-0.12, "right") if last else (0.12, "left")
        label, align = (a[0] + side[0], (a[1] + b[1]) / 2), {"ha": side[1], "va": "center"}
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.3})
    ax.text(*label, text, fontsize=11, color=style.INK, **align)


def series_roadmap(out_dir: Path | str, d: int = 128, t: int = 131_072) -> list[Path]:
    """Figure 9: the update rules as a lattice from linear attention to DPLR / RWKV-7 (the delta
    rule, then the generalized delta rule, to the right; decay downwards), and under it the hybrid
    of three KDA layers to one full-attention layer, with its memory at step ``t`` (r = d)."""
    plt = style.pyplot()
    fig = plt.figure(figsize=(11.2, 7.9))  # one inch per unit of the drawing
    ax = style.blank_axes(fig)
    for name in METHODS:
        _box(ax, name)
    for start, end, text in EDGES:
        _edge(ax, start, end, text)
    _hybrid(ax, d, t)
    ax.text(
        0.0,
        -0.55,
        r"One $r \times d$ memory per head, read as $o_t = S_t^\top q_t$. $\alpha_t$: forget rate "
        "in (0, 1], a number or one per channel;\n"
        r"$\beta_t$: write strength; keys of unit length for the delta rules; $a_t, b_t$: any "
        r"vectors of length $r$, $p_t$: Comba's read key."
        "\nNotation of Kimi Team (2025).",
        fontsize=11,
        va="top",
    )
    ax.set_xlim(-0.05, 11.15)
    ax.set_ylim(-1.45, 6.45)
    return style.save(fig, out_dir, "series-roadmap")


def _hybrid(ax, d: int, t: int) -> None:
    """The row of layers, one in four with full attention and its KV cache, fed by KDA's box
    above it; to its right its title and its memory (as a fraction of all-full-attention, and how
    much smaller the KV cache is)."""
    layers = HYBRID_PATTERN * 2
    y = HYBRID_TOP - LAYER_HEIGHT
    for i, layer in enumerate(layers):
        full = layer == HYBRID_PATTERN[-1]
        x = i * (LAYER_WIDTH + LAYER_GAP)
        ax.add_patch(
            style._rectangle(
                (x, y),
                LAYER_WIDTH,
                LAYER_HEIGHT,
                style.KEY if full else style.STATE,
                fill="#fdf0e2" if full else "#f6f2fb",
            )
        )
        ax.text(x + LAYER_WIDTH / 2, y + LAYER_HEIGHT / 2, layer, ha="center", va="center",
                fontsize=10.5)  # fmt: skip
    x, bottom, width = _corner("kda")  # the arrow ends on a KDA layer
    ax.annotate(
        "",
        xy=(x + width / 2, HYBRID_TOP + 0.06),
        xytext=(x + width / 2, bottom - 0.06),
        arrowprops={"arrowstyle": "-|>", "color": style.INK, "lw": 1.3},
    )
    right, middle = len(layers) * (LAYER_WIDTH + LAYER_GAP) + 0.15, y + LAYER_HEIGHT / 2
    ax.text(right, middle + 0.05, "Hybrid (Kimi Linear): 3 KDA layers\nto 1 of full attention",
            ha="left", va="bottom", fontsize=11, weight="bold")  # fmt: skip
    fraction, smaller = _hybrid_memory(layers, d, t)
    ax.text(
        right,
        middle,
        f"memory at $t$ = {t:,}, $d = r = {d}$:\n{fraction:.1%} of all-full-attention\n"
        f"(KV cache {smaller:.0%} smaller)",
        ha="left",
        va="top",
        fontsize=10.5,
        color=style.KEY,
    )


def _hybrid_memory(layers: tuple[str, ...], d: int, t: int) -> tuple[float, float]:
    """(the hybrid's memory as a fraction of all-full-attention, how much smaller the KV cache
    is), from the cost model of ``linattn.reference``."""
    cache = reference.kv_cache_numbers(t, d)
    state = reference.delta_state_numbers(d, d)
    full_layers = layers.count(HYBRID_PATTERN[-1])
    hybrid = full_layers * cache + (len(layers) - full_layers) * state
    return hybrid / (len(layers) * cache), 1 - full_layers / len(layers)
