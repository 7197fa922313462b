"""Beyond a fixed memory: where log-linear attention, MesaNet, FoX, PaTH and DeltaFormer sit on
Figure 3's axes (spec sections 2, 5, 9).

Figure 3 sets softmax attention's cache, which grows with t, against linear attention's state,
which does not. The mechanisms after the spec fill the space between: log-linear attention keeps
a state per level of a Fenwick hierarchy (log t of them), MesaNet a second, r x r state; FoX,
PaTH and DeltaFormer keep softmax's cache with more work per token. Every number comes from the
decoding cost model of ``linattn.reference.costs`` (one head, r = d).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn.figures import style
from linattn.reference import costs

CAPTION = (
    "Figure 10. Beyond a fixed memory: numbers stored at step t (left) and memory against work "
    "per generated token at one t (right), one head. Log-linear attention's memory grows as "
    "log t, MesaNet's is fixed at r^2 + r d; FoX, PaTH and DeltaFormer keep softmax's cache."
)
GROWING = "#1a8a8a"  # log-linear attention: between the fixed states and the caches


def _series(d: int, steps: np.ndarray) -> list[tuple[str, str, str, np.ndarray, np.ndarray]]:
    """(label, colour, line style, numbers stored, operations per step) per mechanism."""
    r = d
    at = [int(s) for s in steps]

    def fixed(value: int) -> np.ndarray:
        return np.full(len(at), float(value))

    return [
        ("softmax, stick-breaking: $2td$", style.KEY, "-",
         np.array([costs.kv_cache_numbers(s, d) for s in at], float),
         np.array([costs.softmax_step_ops(s, d) for s in at], float)),
        ("FoX: $2td + t$", style.ERROR, ":",
         np.array([costs.forgetting_cache_numbers(s, d) for s in at], float),
         np.array([costs.softmax_step_ops(s, d) for s in at], float)),
        ("PaTH, DeltaFormer: $2td$, work $8td$", style.QUERY, "--",
         np.array([costs.kv_cache_numbers(s, d) for s in at], float),
         np.array([costs.path_step_ops(s, d) for s in at], float)),
        ("log-linear Mamba-2: $(\\lfloor\\log_2 t\\rfloor + 1)\\,rd$", GROWING, "-",
         np.array([costs.log_linear_state_numbers(s, r, d) for s in at], float),
         np.array([costs.log_linear_step_ops(s, r, d) for s in at], float)),
        ("MesaNet: $r^2 + rd$", style.STATE, "-",
         fixed(costs.mesa_state_numbers(r, d)), fixed(costs.mesa_step_ops(r, d))),
        ("delta rule: $rd$", style.VALUE, "-",
         fixed(costs.delta_state_numbers(r, d)), fixed(costs.delta_step_ops(r, d))),
    ]  # fmt: skip


def beyond_fixed_memory(out_dir: Path | str, d: int = 128, t: int = 16_384) -> list[Path]:
    """Figure 10: memory against t (left) and memory against work per step at ``t`` (right)."""
    plt = style.pyplot()
    steps = np.unique(np.geomspace(1, 8 * t, 300).astype(np.int64))
    series = _series(d, steps)
    fig, (memory, scatter) = plt.subplots(1, 2, figsize=(10.8, 4.8))
    for label, color, ls, numbers, _ in series:
        memory.loglog(steps, numbers, color=color, lw=2, ls=ls, label=label)
    memory.axvline(t, color=style.SCORE, lw=1)
    memory.set_xlabel("generation step $t$ (tokens so far)")
    memory.set_ylabel("numbers stored, one head")
    memory.set_title(f"Memory at step $t$ ($d = r = {d}$)")
    memory.legend(loc="upper left", frameon=False, fontsize=10)
    memory.set_ylim(top=float(series[0][3][-1]) * 300)  # room for the legend above the lines
    memory.set_xlim(1, 8 * t)

    # FoX's cache is t numbers above softmax's (0.4% at d = 128): its label goes below the point
    for label, color, _, numbers, work in _series(d, np.array([t])):
        below = label.startswith("FoX")
        scatter.loglog(numbers[0], work[0], "o", color=color, ms=8, mfc="none" if below else color)
        scatter.annotate(
            label.split(":")[0], (numbers[0], work[0]), xytext=(-6, -16) if below else (8, 6),
            ha="right" if below else "left", textcoords="offset points", fontsize=10.5,
            color=color,
        )  # fmt: skip
    scatter.set_xlabel(f"numbers stored at $t = {t:,}$, one head")
    scatter.set_ylabel("operations per generated token")
    scatter.set_title(f"Memory against work at $t = {t:,}$")
    scatter.set_xlim(costs.delta_state_numbers(d, d) / 4, costs.kv_cache_numbers(t, d) * 40)
    scatter.set_ylim(costs.delta_step_ops(d, d) / 4, costs.path_step_ops(t, d) * 8)
    for ax in (memory, scatter):
        ax.minorticks_off()
        ax.grid(True, which="major", color="#dddddd", lw=0.6)
    fig.tight_layout()
    return style.save(fig, out_dir, "beyond-fixed-memory")
