"""Load, or build, the fused CPU chunk kernels (csrc/) now, check them and report the result.

The package build compiles ``src/linattn/ops/csrc/*.cpp`` into the package; where that binary is
missing or does not fit (other sources, another torch), a source tree compiles them on first use
(cached under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache``). This command loads the installed
binary, or else compiles (or loads the cached build), in an installed package too; it then runs one
small forward and backward pass of the gated delta rule through the kernels against the float64
recurrent form, and prints which binary it is and how it went. Exit status 0 when the kernels are
ready, 1 when they are not (no compiler, a failed build, ``LINATTN_NATIVE=0``, another process's
compile held the lock longer than ``LINATTN_BUILD_TIMEOUT`` seconds): the chunk form then runs
its PyTorch loop.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from linattn.ops import delta_rule, native

CHECK_TOLERANCE = 1e-5  # float32 rounding is about 1e-7 here


def configure(parser: argparse.ArgumentParser) -> None:
    """No options: the build follows ``TORCH_EXTENSIONS_DIR`` and ``LINATTN_BUILD_TIMEOUT``."""


def self_check() -> float:
    """The largest relative RMS error of a small gated delta rule (T = 37, chunks of 16: forward
    and every gradient) in float32 through the kernels, against float64 in the recurrent form."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 2, 37, 2, 8, 4
    x64 = {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": torch.nn.functional.normalize(
            torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1
        ),
        "v": torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
        "beta": torch.rand(B, T, H, generator=gen, dtype=torch.float64),
        "g": -torch.rand(B, T, H, generator=gen, dtype=torch.float64) / 4,
    }

    def run(dtype: torch.dtype, mode: str) -> list[torch.Tensor]:
        x = {n: t.to(dtype).requires_grad_() for n, t in x64.items()}
        o, S = delta_rule(**x, mode=mode, chunk_size=16, output_final_state=True)
        (o.square().sum() + S.sum()).backward()
        return [o.detach(), S.detach(), *(t.grad for t in x.values())]

    errors = [
        float((a.double() - b).norm() / b.norm())
        for a, b in zip(run(torch.float32, "chunk"), run(torch.float64, "recurrent"), strict=True)
    ]
    return max(errors)


def run(args: argparse.Namespace) -> int:
    """Build or load the kernels, check them, print the result; 0 when they are ready."""
    start = time.monotonic()
    native.load(compile_anywhere=True)  # an installed package compiles here too
    ready = native.available()
    seconds = time.monotonic() - start
    if not ready:
        print(
            "linattn build: error: the fused CPU chunk kernels are unavailable "
            f"({native.reason()}); the chunk form runs its PyTorch loop",
            file=sys.stderr,
        )
        return 1
    error = self_check()
    if not error <= CHECK_TOLERANCE:
        print(
            "linattn build: error: the fused CPU chunk kernels "
            f"({native.location()}) failed their check: {error:.1e} from float64, "
            f"more than {CHECK_TOLERANCE:g}",
            file=sys.stderr,
        )
        return 1
    print(
        f"linattn build: the fused CPU chunk kernels are ready ({native.reason()}; "
        f"{seconds:.1f} s); a float32 forward and backward pass "
        f"through them is {error:.1e} from float64 (relative)"
    )
    return 0
