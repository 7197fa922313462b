"""Which compiled ops a test's calls run: the families with kernels of their own assert that
their float32 calls reached them (and that the others did not)."""

from __future__ import annotations

import torch

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


def on_threads(fn, *counts: int) -> list:
    """``fn()`` run once under each of ``counts`` intra-op threads, the caller's count restored."""
    threads = torch.get_num_threads()
    try:
        results = []
        for n in counts:
            torch.set_num_threads(n)
            results.append(fn())
        return results
    finally:
        torch.set_num_threads(threads)
