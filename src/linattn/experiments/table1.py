"""Table 1 of the spec (section 7.3): the read error of additive, delta and least-squares memories.

For each n, a generator seeded with ``seed`` draws, in each repetition, n random unit keys and then
n random unit values in R^r; the table gives the root-mean-square read error of each memory and the
two theory columns. The defaults (r = d = 32, n in 8..128, 200 repetitions, seed 2) reproduce the
spec's table to three decimals.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from tqdm import tqdm

from linattn.experiments._args import check_memory, int_list, nonnegative_int, positive_int
from linattn.reference import recall_errors, recall_theory
from linattn.reference.checks import as_positive_int

COLUMNS = (
    ("additive", "Additive"),
    ("additive_theory", "Theory"),
    ("delta_all", "Delta, all pairs"),
    ("delta_newest", "Delta, 8 newest"),
    ("least_squares", "Least squares"),
    ("least_squares_theory", "Theory"),
    ("mesanet", "MesaNet, $\\lambda = 1$"),
)


def compute_table1(
    r: int = 32,
    ns: Sequence[int] = (8, 16, 32, 64, 128),
    repetitions: int = 200,
    seed: int = 2,
    progress: bool = False,
) -> list[dict[str, float]]:
    """One row per n: n, the measured errors of ``recall_errors`` (MesaNet's memory with lambda =
    1 last) and the two theory values.

    ``progress`` shows a tqdm bar on stderr (after one second, and only on a terminal).
    """
    r, repetitions = as_positive_int("r", r), as_positive_int("repetitions", repetitions)
    if isinstance(ns, (str, bytes)) or not isinstance(ns, Sequence) or len(ns) == 0:
        raise ValueError(f"ns must be a non-empty sequence of integers >= 1, got {ns!r}")
    ns = [as_positive_int("ns", n) for n in ns]
    bar = tqdm(
        total=len(ns) * repetitions,
        desc="Table 1",
        unit="rep",
        delay=1.0,
        disable=None if progress else True,
    )
    rows = []
    with bar:
        for n in ns:
            errors = recall_errors(n, r, repetitions, seed, on_repetition=bar.update)
            additive_theory, least_squares_theory = recall_theory(n, r)
            rows.append(
                {
                    "n": n,
                    "additive": errors["additive"],
                    "additive_theory": additive_theory,
                    "delta_all": errors["delta, all pairs"],
                    "delta_newest": errors["delta, 8 newest"],
                    "least_squares": errors["least squares"],
                    "least_squares_theory": least_squares_theory,
                    "mesanet": errors["mesanet"],
                }
            )
    return rows


def table1_markdown(rows: list[dict[str, float]], r: int = 32, repetitions: int = 200) -> str:
    """The table as Markdown, in the spec's layout, every cell to three decimals."""
    caption = (
        f"**Table 1. Root-mean-square read error of four memories with $r = d = {r}$** "
        f"(random unit keys and values, $\\beta_t = 1$ for the delta rule, {repetitions} "
        "repetitions; MesaNet: the least-squares memory with ridge $\\lambda = 1$; a memory that "
        "returns zero has error 1)."
    )
    header = "| Pairs stored $n$ | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [caption, "", header, "|" + "---|" * (len(COLUMNS) + 1)]
    for row in rows:
        cells = " | ".join(f"{row[key]:.3f}" for key, _ in COLUMNS)
        lines.append(f"| {row['n']} | {cells} |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn table1``."""
    parser.add_argument("--r", type=positive_int, default=32, help="key and value dimension r = d")
    parser.add_argument(
        "--ns", type=int_list, default=[8, 16, 32, 64, 128], help="pairs stored, e.g. 8,16,32"
    )
    parser.add_argument("--repetitions", type=positive_int, default=200, help="repetitions per n")
    parser.add_argument(
        "--seed", type=nonnegative_int, default=2, help="seed of each n's generator"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def memory_needed(r: int, ns: Sequence[int]) -> int:
    """Bytes of the largest tensors of one repetition (a lower bound of the peak): the four
    r x r float64 memories and the n keys and values in R^r, at the largest n."""
    return 8 * (4 * r * r + 2 * max(ns) * r)


def run(args: argparse.Namespace) -> int:
    """Compute the table and print it as Markdown or JSON."""
    ns = ",".join(map(str, args.ns))
    check_memory(f"--r {args.r} --ns {ns}", memory_needed(args.r, args.ns))
    rows = compute_table1(args.r, args.ns, args.repetitions, args.seed, progress=True)
    if args.json:
        payload = {"r": args.r, "repetitions": args.repetitions, "seed": args.seed, "rows": rows}
        print(json.dumps(payload, indent=2))
    else:
        print(table1_markdown(rows, args.r, args.repetitions))
    return 0
