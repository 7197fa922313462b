"""Every registered family against its nearest mechanism, as paired ratios of one run.

For each registry entry that names a ``nearest`` mechanism, the entry's own op and its nearest's,
both through their registry ``case`` (the inputs a model would feed, float32, B = 1), are timed in
turns: forward, and forward plus backward (the sum of the output and the final state as the
loss, every floating input differentiated). The form is the chunk form where both have one, else
the recurrent form of both (a family without a chunk form against the recurrent form of its
nearest rule). Each turn times the two calls a moment apart; the median of the turns' own ratios
is reported with their lowest and highest, so a slow minute on a shared machine drops out.

The same inputs: the nearest is fed the same B, T, H, and the (K, V) of the entry's case's
``nearest_dims`` where the family's kernel works at another width than its inputs' (Based and
ReBased work on feature maps of their keys: the nearest, linear attention, is then fed keys of
that feature width, so that the pair compares the same memory's work, not a K x V state with a
K^2 x V one); elsewhere the same K and V.

The lines are the issue's: 1.05 for an entry whose case is its nearest's op on the nearest's own
inputs, only the gate's values its own (``case.as_nearest``: retention's constant decays, and
lightning attention's, against scalar decay), 1.3 for every other family.

    PYTHONPATH=src python benchmarks/families.py                      # T 16,384, H 8, K = V = 64
    PYTHONPATH=src python benchmarks/families.py --T 256 --repeats 1  # a quick check
    PYTHONPATH=src python benchmarks/families.py --mechanisms retention,hgrn --threads 2

``--nearest-calls n`` runs the nearest n times in each of its timed calls (one turn still times
the two sides a moment apart): a family that makes n passes of its nearest's memory, as gated
slot attention makes two of GLA's, is then compared with those n passes
(``--mechanisms gsa,abc --nearest-calls 2``); the table names the nearest "x n".

``--clock cpu`` times with the process's CPU time instead of wall-clock time (on one thread, a
machine shared with other jobs then slows neither side of a pair).

It prints a table and writes ``--out`` (JSON) with every time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from linattn import registry
from linattn.experiments import _timing
from linattn.experiments._timing import median, paired_ratios, times_in_turns

REPARAMETRISATION_LINE = 1.05
FAMILY_LINE = 1.3


def _form(entry: registry.Entry, nearest: registry.Entry) -> str | None:
    """The chunk form where both have one, else the recurrent form, else None (a pair with
    only the quadratic parallel form in common is timed by its own benchmark)."""
    both = set(entry.forms) & set(nearest.forms)
    return next((form for form in ("chunk", "recurrent") if form in both), None)


def _line(entry: registry.Entry) -> float:
    return REPARAMETRISATION_LINE if entry.case.as_nearest else FAMILY_LINE


def _nearest_dims(entry: registry.Entry, K: int, V: int) -> tuple[int, int]:
    """The (K, V) the nearest is fed (the module docstring: the same inputs)."""
    return (K, V) if entry.case.nearest_dims is None else entry.case.nearest_dims(K, V)


def _calls(entry: registry.Entry, form: str, T: int, H: int, K: int, V: int, chunk: int | None):
    """(forward, forward + backward) closures of ``entry``'s op on its case's float32 inputs."""
    x = entry.case.inputs(1, T, H, K, V, seed=0, dtype=torch.float32)
    scale = K**-0.5
    size = chunk if chunk is not None else 64

    def forward():
        with torch.no_grad():
            return entry.case.call(x, form, size, scale)

    leaves = {
        name: t.detach().requires_grad_(True)
        for name, t in x.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    }

    def forward_backward():
        for t in leaves.values():
            t.grad = None
        o, S = entry.case.call({**x, **leaves}, form, size, scale)
        loss = o.sum() if S is None else o.sum() + sum(s.sum() for s in _tensors(S))
        loss.backward()

    return forward, forward_backward


def _tensors(S) -> list[torch.Tensor]:
    if isinstance(S, torch.Tensor):
        return [S]
    return [t for part in S for t in _tensors(part)] if isinstance(S, (tuple, list)) else []


def _repeated(calls, n: int):
    """``calls`` (forward, forward + backward), each run n times in a row as one call."""
    if n == 1:
        return calls

    def times(f):
        def call():
            for _ in range(n):
                f()

        return call

    return tuple(times(f) for f in calls)


def measure(names, T, H, K, V, repeats, threads, chunk=None, also_nearest_K=None, nearest_calls=1):
    """The rows of the table; with ``also_nearest_K``, each pair is timed a second time against
    the nearest fed keys of that width (its own row, labelled with the nearest's K and V)."""
    torch.set_num_threads(threads)
    rows = []
    for entry in registry.mechanisms():
        if entry.nearest is None or (names and entry.name not in names):
            continue
        nearest = registry.get(entry.nearest)
        form = _form(entry, nearest)
        if form is None:
            print(f"| {entry.name} | {nearest.name} | no chunk or recurrent form in common |")
            continue
        nK, nV = _nearest_dims(entry, K, V)
        widths = [(nK, nV)] + ([(also_nearest_K, nV)] if also_nearest_K else [])
        for nK, nV in widths:
            rows.append(
                _pair(entry, nearest, form, T, H, K, V, nK, nV, repeats, chunk, nearest_calls)
            )
    return rows


def _pair(entry, nearest, form, T, H, K, V, nK, nV, repeats, chunk, nearest_calls=1) -> dict:
    """One row: ``entry`` against ``nearest`` fed (nK, nV), forward and forward + backward."""
    own = _calls(entry, form, T, H, K, V, chunk)
    base = _repeated(_calls(nearest, form, T, H, nK, nV, chunk), nearest_calls)
    label = nearest.name if nearest_calls == 1 else f"{nearest.name} x{nearest_calls}"
    row = {"mechanism": entry.name, "nearest": label, "form": form,
           "nearest_K": nK, "nearest_V": nV, "line": _line(entry)}  # fmt: skip
    for pass_, index in (("fwd", 0), ("fwdbwd", 1)):
        own[index](), base[index]()  # warm-up: first-call costs stay out of the turns
        mine, theirs = times_in_turns([own[index], base[index]], repeats)
        ratio = paired_ratios(mine, theirs)
        row[f"{pass_}_s"], row[f"{pass_}_nearest_s"] = median(mine), median(theirs)
        row[f"{pass_}_ratio"] = ratio
    row["ok"] = all(row[f"{p}_ratio"]["median"] <= row["line"] for p in ("fwd", "fwdbwd"))
    print(_format(row, K, V), flush=True)
    del own, base  # the inputs and their gradients, before the next pair's
    return row


HEADER = (
    "| mechanism | nearest | form | fwd ms | nearest fwd ms | ratio (low-high) "
    "| fwd+bwd ms | nearest fwd+bwd ms | ratio (low-high) | line | within |"
)


def _format(row: dict, K: int, V: int) -> str:
    nearest = row["nearest"]
    if (row["nearest_K"], row["nearest_V"]) != (K, V):
        nearest += f" (K {row['nearest_K']}, V {row['nearest_V']})"
    cells = [row["mechanism"], nearest, row["form"]]
    for p in ("fwd", "fwdbwd"):
        r = row[f"{p}_ratio"]
        cells += [f"{row[f'{p}_s'] * 1e3:.1f}", f"{row[f'{p}_nearest_s'] * 1e3:.1f}",
                  f"{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})"]  # fmt: skip
    cells += [f"{row['line']:.2f}", "yes" if row["ok"] else "NO"]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--V", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk-size", type=int, default=None, help="default: 64")
    parser.add_argument("--mechanisms", default="", help="comma-separated registry names")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for every time")
    parser.add_argument(
        "--nearest-calls",
        type=int,
        default=1,
        help="run the nearest this many times a timed call (default 1)",
    )
    parser.add_argument("--clock", choices=sorted(_timing.CLOCKS), default="wall")
    parser.add_argument(
        "--also-nearest-K", type=int, default=None,
        help="also time each pair against the nearest fed keys of this width (a second row)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = [n for n in args.mechanisms.split(",") if n]
    for name in names:
        registry.get(name)  # an unknown name fails here, before any work
    if args.nearest_calls < 1:
        parser.error(f"--nearest-calls must be >= 1, got {args.nearest_calls}")
    _timing.use_clock(args.clock)
    print(f"T {args.T:,}, H {args.H}, K {args.K}, V {args.V}, float32, {args.threads} thread(s), "
          f"{args.repeats} turns, {args.clock} clock; torch {torch.__version__}, "
          f"{platform.platform()}")  # fmt: skip
    print(HEADER)
    print("|" + "---|" * 11)
    rows = measure(names, args.T, args.H, args.K, args.V, args.repeats, args.threads,
                   args.chunk_size, args.also_nearest_K, args.nearest_calls)  # fmt: skip
    if args.out is not None:
        keys = ("T", "H", "K", "V", "repeats", "threads", "clock", "nearest_calls")
        setup = {k: getattr(args, k) for k in keys}
        setup["torch"] = torch.__version__
        args.out.write_text(json.dumps({"setup": setup, "rows": rows}, indent=1) + "\n")
    failed = [row["mechanism"] for row in rows if not row["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} within their line"
          + (f"; above it: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
