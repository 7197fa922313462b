"""Accuracy of the PyTorch ops: every mechanism and form against the float64 oracle.

For each row of the mechanism table (docs/design.md: linear attention, scalar decay, GLA, delta
rule, Gated DeltaNet, KDA) and each form (parallel, recurrent, chunk), runs the op on one random
problem in
float64, float32, bfloat16 and float16 and compares it with
``linattn.reference.gated.recurrence``: the largest absolute error for float64, the relative RMS
error for the others (the low-precision inputs are rounded first and the oracle sees the rounded
values).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from linattn.experiments._args import check_memory, nonnegative_int, positive_int
from linattn.ops import delta_rule, linear_attention
from linattn.reference.gated import recurrence

MECHANISMS = {  # name: (rule, gate shape)
    "linear attention": ("additive", None),
    "scalar decay (Mamba-2)": ("additive", "scalar"),
    "per-channel decay (GLA)": ("additive", "channel"),
    "delta rule": ("delta", None),
    "Gated DeltaNet": ("delta", "scalar"),
    "KDA": ("delta", "channel"),
}
FORMS = (("parallel", 1), ("recurrent", 1), ("chunk", 64))
DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _problem(rule, gate, T, K, V, seed):
    """float64 q, k (unit length), v, beta in [0, 2], g = logsigmoid(N(2, 1)), an initial state."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(1, T, 2, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(1, T, 2, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(1, T, 2, V, generator=gen, dtype=torch.float64),
        "beta": 2 * torch.rand(1, T, 2, generator=gen, dtype=torch.float64),
        "S0": torch.randn(1, 2, K, V, generator=gen, dtype=torch.float64),
    }
    shape = {None: None, "scalar": (1, T, 2), "channel": (1, T, 2, K)}[gate]
    x["g"] = None if shape is None else F.logsigmoid(torch.randn(shape, generator=gen) + 2.0)
    if rule != "delta":
        x["beta"] = None
    return x


def _oracle(x, rule, scale):
    """o [1, T, H, V] from the literal recurrence, head by head, float64."""
    n = {k: (None if t is None else t.double().numpy()) for k, t in x.items()}
    heads = []
    for h in range(n["q"].shape[2]):
        o, _ = recurrence(
            n["q"][0, :, h], n["k"][0, :, h], n["v"][0, :, h],
            None if n["beta"] is None else n["beta"][0, :, h],
            None if n["g"] is None else n["g"][0, :, h],
            rule=rule, scale=scale, initial_state=n["S0"][0, h],
        )  # fmt: skip
        heads.append(o)
    return torch.from_numpy(np.stack(heads, axis=1)[None])


def compute_accuracy(T: int = 1000, K: int = 16, V: int = 16, seed: int = 0) -> list[dict]:
    """One row per (mechanism, form): errors for each dtype against the float64 oracle."""
    scale = K**-0.5
    rows = []
    for name, (rule, gate) in MECHANISMS.items():
        x64 = _problem(rule, gate, T, K, V, seed)
        errors: dict[str, dict[str, float]] = {form: {} for form, _ in FORMS}
        for dname, dtype in DTYPES.items():
            x = {k: (None if t is None else t.to(dtype)) for k, t in x64.items()}
            ref = _oracle(x, rule, scale)
            for form, C in FORMS:
                kw = dict(mode=form, chunk_size=C, initial_state=x["S0"], scale=scale)
                if rule == "delta":
                    o, _ = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **kw)
                else:
                    o, _ = linear_attention(x["q"], x["k"], x["v"], x["g"], **kw)
                diff = o.double() - ref
                if dtype == torch.float64:
                    errors[form][dname] = float(diff.abs().max())
                else:
                    errors[form][dname] = float(
                        diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
                    )
        for form, _ in FORMS:
            rows.append({"mechanism": name, "form": form, **errors[form]})
    return rows


def accuracy_markdown(rows: list[dict], T: int = 1000, K: int = 16, V: int = 16) -> str:
    """The rows as a Markdown table."""
    lines = [
        f"T = {T}, K = {K}, V = {V}, two heads, an initial state; chunk size 64.",
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
