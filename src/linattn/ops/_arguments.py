"""The checks every public op runs before any work, in one order (docs/design.md, "Input checking
before work"): q, k, v and their sizes, the rule's own inputs, the gate, mode and chunk size,
scale, output_final_state, packed sequences, the initial state. Each op passes its own inputs'
check (``own``); the errors name the user's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from linattn.ops import checks as _checks


class Checked(NamedTuple):
    """What the checks found: the sizes, the chunk size as an int, output_final_state as a bool.

    B, T: batch and tokens; H, HV: query/key and value heads; K, V: key and value sizes; N: the
    sequences (B, or the packed sequences of ``cu_seqlens``). A tuple: it is made on every call,
    and a frozen dataclass's constructor costs several times a tuple's."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int
    chunk_size: int
    output_final_state: bool


def check_op(
    q: object,
    k: object,
    v: object,
    g: object,
    *,
    mode: object,
    chunk_size: object,
    scale: object,
    output_final_state: object,
    cu_seqlens: object,
    initial_state: object,
    own: Callable[[int, int, int, int, int], None] | None = None,
    state_columns: int = 0,
) -> Checked:
    """Run the checks of the module docstring; ``own(B, T, HV, K, V)`` checks the op's own inputs
    (a rule's, an option's) right after q, k and v; ``state_columns``: the initial state's extra
    columns beyond V (linear attention's normaliser)."""
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v)
    if own is not None:
        own(B, T, HV, K, V)
    _checks.gate(g, B, T, HV, K)
    chunk_size = _checks.options(mode, chunk_size)
    _checks.scale(scale)
    output_final_state = _checks.flag("output_final_state", output_final_state)
    N = _checks.seqlens(cu_seqlens, B, T)
    _checks.state(initial_state, N, HV, K, V + state_columns)
    return Checked(B, T, H, HV, K, V, N, chunk_size, output_final_state)
