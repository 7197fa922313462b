"""The two numbers files of the spec's appendix, as TeX macros read by its TikZ figures.

``attention-maps-numbers.tex`` holds the matrices of Figure 4 (section 6.1) and
``memory-numbers.tex`` the memory comparison of Figure 3 (section 5), with the macro names and
number formats of the spec's appendix (``\\MapN``, ``\\SoftmaxWeights`` as ``i/j/0.1234, ...``,
``\\CacheRatio``, ``\\BreakEven``, ...). Every number is computed by ``linattn.reference``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from linattn import reference

HEADER = "% Written by linattn (linattn.figures.numbers); do not edit."
# Singular values at or below this are zero up to rounding (they are below 1e-15 for A4).
ZERO = 1e-12


def group(x: int) -> str:
    """Thousands separators that TeX math keeps tight: 131072 -> ``131{,}072``."""
    return f"{x:,}".replace(",", "{,}")


def _matrix_macros(name: str, M: np.ndarray) -> list[str]:
    """\\<name>Weights, LogSingular, Zeros, Rank and MaxWeight of one attention matrix."""
    sv = np.linalg.svd(M, compute_uv=False)
    nonzero = sv[sv > ZERO]
    rows, cols = M.shape
    weights = ", ".join(f"{i}/{j}/{M[i, j]:.4f}" for i in range(rows) for j in range(cols))
    logs = ", ".join(f"{i}/{np.log10(s):.3f}" for i, s in enumerate(nonzero))
    return [
        rf"\def\{name}Weights{{{weights}}}",
        rf"\def\{name}LogSingular{{{logs}}}",
        rf"\def\{name}Zeros{{{len(sv) - len(nonzero)}}}",
        rf"\def\{name}Rank{{{reference.matrix_rank(M)}}}",
        rf"\def\{name}MaxWeight{{{reference.mean_peak_weight(M):.2f}}}",
    ]


def attention_maps_numbers(seed: int = 1, n: int = 16, d: int = 4, scale: float = 1.5) -> str:
    """The text of ``attention-maps-numbers.tex``: Figure 4's P and A, from
    ``reference.attention_maps(np.random.default_rng(seed), n, d, scale)`` (the spec: seed 1)."""
    P, A = reference.attention_maps(np.random.default_rng(seed), n=n, d=d, scale=scale)
    lines = [
        HEADER,
        rf"\def\MapN{{{n}}}",
        rf"\def\MapD{{{d}}}",
        rf"\def\MapScale{{{scale:g}}}",
        rf"\def\MapUniform{{{1 / n:.4f}}}",
    ]
    for name, M in (("Softmax", P), ("Linear", A)):
        lines += _matrix_macros(name, M)
    return "\n".join(lines) + "\n"


def memory_numbers(d: int = 128, t: int = 131_072) -> str:
    """The text of ``memory-numbers.tex``: one head with r = d after t tokens (section 5).

    KV cache 2td numbers, linear-attention state rd + r, their ratio rounded, and the break-even
    step (``reference.break_even_tokens``).
    """
    cache, state = reference.kv_cache_numbers(t, d), reference.linear_state_numbers(d, d)
    lines = [
        HEADER,
        rf"\def\HeadDim{{{d}}}",
        rf"\def\Tokens{{{group(t)}}}",
        rf"\def\CacheNumbers{{{group(cache)}}}",
        rf"\def\StateNumbers{{{group(state)}}}",
        rf"\def\CacheRatio{{{group(round(cache / state))}}}",
        rf"\def\BreakEven{{{reference.break_even_tokens(d, d)}}}",
    ]
    return "\n".join(lines) + "\n"


def write_numbers(out_dir: Path | str) -> list[Path]:
    """Write both numbers files into ``out_dir`` with the spec's inputs; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    maps, memory = out_dir / "attention-maps-numbers.tex", out_dir / "memory-numbers.tex"
    maps.write_text(attention_maps_numbers())
    memory.write_text(memory_numbers())
    return [maps, memory]
