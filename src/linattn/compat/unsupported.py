"""fla 0.6.0 entry points for mechanisms linattn does not compute: each raises
NotImplementedError naming what is missing (and what linattn has instead, where it has it)."""

from __future__ import annotations

from collections.abc import Callable

MISSING = {
    "parallel_attn": "fla's flash attention (sliding windows, sinks, gates; "
    "linattn.ops.softmax_attention is linattn's causal softmax attention)",
    "parallel_forgetting_attn": "the forgetting transformer (softmax with a forget gate)",
    "parallel_nsa": "native sparse attention (block selection)",
    "parallel_parallax": "Parallax attention",
    "parallel_stickbreaking_attn": "stick-breaking attention",
    "parallel_wall_attn": "WALL attention",
    "parallel_wall_attn_decode": "WALL attention's decoding step",
}


def _missing(name: str, what: str) -> Callable[..., object]:
    def entry(*args: object, **kwargs: object) -> object:
        raise NotImplementedError(
            f"linattn.compat.{name}: linattn does not compute {what}; run fla's {name} on a GPU"
        )

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"fla's ``{name}``: not computed by linattn ({what}); raises."
    return entry


globals().update({name: _missing(name, what) for name, what in MISSING.items()})
__all__ = sorted(MISSING)
