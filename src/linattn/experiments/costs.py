"""The cost model of section 9: operations and memory of one head, and the Figure 3 numbers.

Prints the section-9 comparison of softmax attention, linear attention and the delta rule (training
in blocks of C, one generation step, memory at step t) for given n, d, r, C, t and d_model, followed
by the memory numbers of Figure 3 and the crossover of section 9. Defaults are the spec's.
"""

from __future__ import annotations

import argparse
import json

from linattn.experiments._args import positive_int
from linattn.reference import (
    attention_matrix_bytes,
    break_even_tokens,
    crossover_tokens,
    delta_state_numbers,
    delta_step_ops,
    delta_training_ops,
    kv_cache_numbers,
    linear_fraction,
    linear_state_numbers,
    linear_step_ops,
    linear_training_ops,
    softmax_step_ops,
    softmax_training_ops,
)
from linattn.reference.costs import delta_to_linear_chunk_ratio

MECHANISMS = ("softmax", "linear", "delta")
TITLES = {"softmax": "Softmax attention", "linear": "Linear attention", "delta": "Delta rule"}
FORMULAS = {
    "training_ops": ("4n^2 d", "2nC(r + d) + 4nrd", "n(4Cr + 3Cd + 6rd)"),
    "step_ops": ("about 4td", "about 4rd", "about 6rd"),
    "memory_numbers": ("2td", "rd + r", "rd"),
}
ROWS = {
    "training_ops": "Training operations",
    "step_ops": "Operations at generation step t",
    "memory_numbers": "Memory at generation step t (numbers)",
}


def compute_costs(
    n: int = 32_768,
    d: int = 128,
    r: int = 128,
    C: int = 64,
    d_model: int = 4_096,
    t: int = 131_072,
) -> dict[str, object]:
    """Every figure of section 9 for one head of n tokens (training) and step t (generation).

    Returns the inputs, the three rows of the section-9 table (one value per mechanism), and the
    memory numbers: KV cache, the two states and their ratios to the cache, the break-even length,
    the bytes of P at n in 2-byte numbers, the crossover n > 6 d_model, the fraction r / (6 d_model)
    and the delta-to-additive cost of one chunk.
    """
    cache, state = kv_cache_numbers(t, d), linear_state_numbers(r, d)
    delta_state = delta_state_numbers(r, d)
    p_bytes = attention_matrix_bytes(n)
    return {
        "inputs": {"n": n, "d": d, "r": r, "C": C, "d_model": d_model, "t": t},
        "training_ops": {
            "softmax": softmax_training_ops(n, d),
            "linear": linear_training_ops(n, r, d, C),
            "delta": delta_training_ops(n, r, d, C),
        },
        "step_ops": {
            "softmax": softmax_step_ops(t, d),
            "linear": linear_step_ops(r, d),
            "delta": delta_step_ops(r, d),
        },
        "memory_numbers": {"softmax": cache, "linear": state, "delta": delta_state},
        "cache_to_linear_state": cache / state,
        "cache_to_delta_state": cache / delta_state,
        "break_even_tokens": break_even_tokens(r, d),
        "attention_matrix_bytes": p_bytes,
        "attention_matrix_gib": p_bytes / 2**30,
        "crossover_tokens": crossover_tokens(d_model),
        "linear_fraction": linear_fraction(r, d_model),
        "delta_to_linear_chunk_ratio": delta_to_linear_chunk_ratio(C, r, d),
    }


def costs_markdown(costs: dict[str, object]) -> str:
    """The section-9 table and the memory numbers as Markdown."""
    p = costs["inputs"]
    lines = [
        f"**Section 9: the cost of one head** (n = {p['n']:,} tokens, d = {p['d']}, r = {p['r']}, "
        f"blocks of C = {p['C']}, generation step t = {p['t']:,})",
        "",
        "| For one head | " + " | ".join(TITLES[m] for m in MECHANISMS) + " |",
        "|---|---|---|---|",
    ]
    for key, title in ROWS.items():
        cells = (f"{f} = {costs[key][m]:,}" for f, m in zip(FORMULAS[key], MECHANISMS, strict=True))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    cache, memory = costs["memory_numbers"]["softmax"], costs["memory_numbers"]
    lines += [
        "",
        "**Memory and crossover (Figure 3 and section 9)**",
        "",
        f"- KV cache after t = {p['t']:,} tokens: {cache:,} numbers",
        f"- state of linear attention: {memory['linear']:,} numbers, "
        f"{costs['cache_to_linear_state']:,.0f} times fewer; of the delta rule: "
        f"{memory['delta']:,}, {costs['cache_to_delta_state']:,.0f} times fewer",
        f"- the state is the size of the cache after about {costs['break_even_tokens']:,} tokens",
        f"- P at n = {p['n']:,} in 2-byte numbers: {costs['attention_matrix_gib']:g} GiB "
        f"({costs['attention_matrix_bytes']:,} bytes)",
        f"- the attention products cost more than the projections and the MLP when "
        f"n > 6 d_model = {costs['crossover_tokens']:,} tokens (d_model = {p['d_model']:,})",
        f"- linear attention costs r / (6 d_model) = {costs['linear_fraction']:.2%} of the rest of "
        "the layer, at every length",
        f"- one chunk of the delta rule costs {costs['delta_to_linear_chunk_ratio']:.3f} times one "
        "of the additive rule",
    ]
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn costs``."""
    parser.add_argument("--n", type=positive_int, default=32_768, help="tokens in training")
    parser.add_argument("--d", type=positive_int, default=128, help="head dimension d")
    parser.add_argument("--r", type=positive_int, default=128, help="features r")
    parser.add_argument("--C", type=positive_int, default=64, help="chunk size C")
    parser.add_argument("--d-model", type=positive_int, default=4_096, help="model width")
    parser.add_argument("--t", type=positive_int, default=131_072, help="generation step t")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    """Compute the cost model and print it as Markdown or JSON."""
    costs = compute_costs(args.n, args.d, args.r, args.C, args.d_model, args.t)
    print(json.dumps(costs, indent=2) if args.json else costs_markdown(costs))
    return 0
