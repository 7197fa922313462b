"""Accuracy of the PyTorch ops: every registered mechanism and form against its float64 oracle.

For each mechanism of the registry (``linattn.registry``) and each of its forms (parallel,
recurrent, chunk), runs the op on one random problem of its case (``linattn.registry.cases``) in
float64, float32, bfloat16 and float16 and compares it with the entry's float64 oracle: the largest
absolute error for float64, the relative RMS error for the others (the low-precision inputs are
rounded first and the oracle sees the rounded values).
"""

from __future__ import annotations

import argparse
import json

import torch

from linattn import registry
from linattn.experiments._args import check_memory, nonnegative_int, positive_int
from linattn.registry.cases import cast

CHUNK_SIZE = 64
DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _errors(entry: registry.Entry, T: int, K: int, V: int, seed: int) -> dict[str, dict]:
    """{form: {dtype name: error}} of one mechanism on one problem (B = 1, two heads)."""
    x64 = entry.case.inputs(1, T, 2, K, V, seed=seed, dtype=torch.float64)
    scale = K**-0.5
    errors: dict[str, dict[str, float]] = {form: {} for form in entry.forms}
    for dname, dtype in DTYPES.items():
        x = {k: cast(t, dtype) for k, t in x64.items()}  # a two-state S0 is a pair
        ref, _ = entry.case.oracle(x, scale)
        for form in entry.forms:
            o, _ = entry.case.call(x, form, CHUNK_SIZE, scale)
            diff = o.double() - ref
            if dtype == torch.float64:
                errors[form][dname] = float(diff.abs().max())
            else:
                errors[form][dname] = float(diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())
    return errors


def compute_accuracy(T: int = 1000, K: int = 16, V: int = 16, seed: int = 0) -> list[dict]:
    """One row per (mechanism, form) of the registry: errors for each dtype against the oracle."""
    rows = []
    for entry in registry.mechanisms():
        for form, errors in _errors(entry, T, K, V, seed).items():
            rows.append({"mechanism": entry.title, "name": entry.name, "form": form, **errors})
    return rows


def accuracy_markdown(rows: list[dict], T: int = 1000, K: int = 16, V: int = 16) -> str:
    """The rows as a Markdown table."""
    lines = [
        f"T = {T}, K = {K}, V = {V}, two heads, an initial state; chunk size {CHUNK_SIZE}.",
        "",
        "| mechanism | form | float64 max abs error | float32 rel RMS | bfloat16 rel RMS "
        "| float16 rel RMS |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        errors = " | ".join(f"{r[name]:.1e}" for name in DTYPES)
        lines.append(f"| {r['mechanism']} | {r['form']} | {errors} |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--T", type=positive_int, default=1000, help="tokens (default 1000)")
    parser.add_argument("--K", type=positive_int, default=16, help="key dimension (default 16)")
    parser.add_argument("--V", type=positive_int, default=16, help="value dimension (default 16)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed (>= 0, default 0)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def memory_needed(T: int, K: int, V: int) -> int:
    """Bytes of the largest tensors of one problem (a lower bound of the peak): the parallel
    form's T x T float64 matrix of each of the 2 heads, and the inputs q, k, v, beta, g, S_0."""
    return 8 * 2 * (T * T + T * (3 * K + V + 2) + K * V)


def run(args: argparse.Namespace) -> int:
    check_memory(f"--T {args.T} --K {args.K} --V {args.V}", memory_needed(args.T, args.K, args.V))
    rows = compute_accuracy(args.T, args.K, args.V, args.seed)
    print(
        json.dumps(rows, indent=1) if args.json else accuracy_markdown(rows, args.T, args.K, args.V)
    )
    return 0
