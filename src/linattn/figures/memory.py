"""Figure 3: the KV cache against the fixed state as t grows, with the break-even point (spec 5, 9).

Every number comes from the cost model in ``linattn.reference`` (``kv_cache_numbers``,
``linear_state_numbers``, ``delta_state_numbers``, ``break_even_tokens`` and the per-step operation
counts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn import reference
from linattn.figures import style

CAPTION = (
    "Figure 3. Generation: softmax attention reads a cache that grows; linear attention reads one "
    "matrix of fixed size."
)


def cache_and_state(out_dir: Path | str, d: int = 128, t: int = 131_072) -> list[Path]:
    """Figure 3: numbers stored and operations per step for one head, against the step t.

    Softmax attention keeps 2td numbers (the KV cache), linear attention rd + r and the delta rule
    rd, with r = d. The break-even step and the ratio at step ``t`` are marked.
    """
    plt = style.pyplot()
    r = d
    steps = np.unique(np.geomspace(1, 2 * t, 400).astype(np.int64))
    cache = np.array([reference.kv_cache_numbers(int(s), d) for s in steps], dtype=float)
    linear_state = float(reference.linear_state_numbers(r, d))
    delta_state = float(reference.delta_state_numbers(r, d))
    even = reference.break_even_tokens(r, d)
    cache_t = reference.kv_cache_numbers(t, d)

    fig, (memory, work) = plt.subplots(1, 2, figsize=(10.8, 4.6))
    memory.loglog(steps, cache, color=style.KEY, lw=2, label="softmax: KV cache, $2td$")
    memory.axhline(linear_state, color=style.STATE, lw=2, label="linear attention: $rd + r$")
    memory.axhline(delta_state, color=style.VALUE, lw=1.5, ls="--", label="delta rule: $rd$")
    memory.plot([even], [reference.kv_cache_numbers(even, d)], "o", color=style.INK)
    memory.annotate(
        f"break-even: t = {even:,}",
        xy=(even, linear_state),
        xytext=(1.5, linear_state * 6),
        fontsize=11,
        arrowprops={"arrowstyle": "->", "color": style.INK},
    )
    _gap_at(memory, t, cache_t, linear_state)
    _zoom_on_the_states(memory, linear_state, delta_state)
    memory.set_xlabel("generation step $t$ (tokens so far)")
    memory.set_ylabel("numbers stored, one head")
    memory.set_title(f"Memory at step $t$ ($d = r = {d}$)")
    memory.legend(loc="upper left", frameon=False)

    _work_panel(work, steps, r, d)
    for ax in (memory, work):
        ax.minorticks_off()  # a log axis over six decades: minor ticks only add clutter (and time)
        ax.set_xlim(1, 2 * t)
        ax.grid(True, which="major", color="#dddddd", lw=0.6)
    memory.set_ylim(top=cache_t * 100)  # room for the note above the cache's line
    fig.tight_layout()
    return style.save(fig, out_dir, "cache-and-state")


def _work_panel(work, steps: np.ndarray, r: int, d: int) -> None:
    """Operations for generation step t, one head: about 4td, 4rd and 6rd (section 9)."""
    work.loglog(
        steps,
        [reference.softmax_step_ops(int(s), d) for s in steps],
        color=style.KEY,
        lw=2,
        label="softmax: about $4td$",
    )
    work.axhline(
        reference.linear_step_ops(r, d),
        color=style.STATE,
        lw=2,
        label="linear attention: about $4rd$",
    )
    work.axhline(
        reference.delta_step_ops(r, d),
        color=style.VALUE,
        lw=1.5,
        ls="--",
        label="delta rule: about $6rd$",
    )
    work.set_xlabel("generation step $t$ (tokens so far)")
    work.set_ylabel("operations for step $t$, one head")
    work.set_title("Work at step $t$")
    work.legend(loc="upper left", frameon=False)


def _gap_at(ax, t: int, cache_t: int, state: float) -> None:
    """The gap between the cache and the state at step t, and a note on it. The note points at
    the cache's end of the gap from above the cache's line: its arrow meets the line there and
    crosses nothing."""
    ax.plot([t, t], [state, cache_t], color=style.ERROR, lw=1)
    ax.plot([t], [cache_t], "o", color=style.ERROR, ms=5)
    ax.annotate(
        f"t = {t:,}: {cache_t:,}\nagainst {int(state):,} numbers,\n"
        f"{cache_t / state:,.0f} times fewer",
        xy=(t, cache_t),
        xytext=(1500, cache_t * 30),
        ha="left",
        va="center",
        fontsize=10.5,
        color=style.ERROR,
        arrowprops={"arrowstyle": "->", "color": style.ERROR, "shrinkB": 4},
    )


def _zoom_on_the_states(ax, linear_state: float, delta_state: float) -> None:
    """An inset on a linear axis: the two fixed states differ by r numbers, 0.8% at r = d = 128,
    so on the log axis their lines coincide."""
    inset = ax.inset_axes((0.64, 0.04, 0.34, 0.16))
    gap = linear_state - delta_state
    for value, color, ls, side in (
        (linear_state, style.STATE, "-", 1),
        (delta_state, style.VALUE, "--", -1),
    ):
        inset.axhline(value, color=color, lw=2, ls=ls)
        inset.text(
            0.5, value + side * 0.25 * gap, f"{value:,.0f}", color=color, fontsize=10,
            ha="center", va="bottom" if side > 0 else "top",
        )  # fmt: skip
    inset.set_ylim(delta_state - 2.2 * gap, linear_state + 2.2 * gap)
    inset.set_xticks([])
    inset.set_yticks([])
    inset.set_xlim(0, 1)
    inset.set_title("the two states, zoomed", fontsize=10, pad=2)
