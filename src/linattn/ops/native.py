"""The fused CPU chunk kernels as the rest of the library sees them: whether they run here and why
not, where they are built, what they are compiled with, and their block cache.

The build, the loading and the calls are ``linattn.ops._native``'s (private to ``linattn.ops``);
these are its public names for ``linattn.cpu``, ``linattn build`` and the benchmarks.
"""

from __future__ import annotations

from linattn.ops._native import (
    DEFINES,
    FLAGS,
    SOURCES,
    available,
    build_directory,
    cache_bytes,
    cache_release,
    load,
    location,
    reason,
)

__all__ = [
    "DEFINES",
    "FLAGS",
    "SOURCES",
    "available",
    "build_directory",
    "cache_bytes",
    "cache_release",
    "load",
    "location",
    "reason",
]
