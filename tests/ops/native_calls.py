"""Which compiled ops a test's calls run: the families with kernels of their own assert that
their float32 calls reached them (and that the others did not)."""

from __future__ import annotations

from linattn.ops import _native


def fused_calls(monkeypatch) -> list[str]:
    """The compiled ops (``_native.fused(name)``) that the calls after this one run, by name, in
    order."""
    called: list[str] = []
    fused = _native.fused

    def counting(name):
        called.append(name)
        return fused(name)

    monkeypatch.setattr(_native, "fused", counting)
    return called
