"""fla 0.6.0 entry points for mechanisms linattn does not compute: each raises
NotImplementedError naming what is missing (and what linattn has instead, where it has it)."""

from __future__ import annotations

from collections.abc import Callable

MISSING = {}


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
