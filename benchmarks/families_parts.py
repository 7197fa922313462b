"""Where the time of GSA, ABC and CyFA goes, part by part, against their nearest (issue 51's pairs).

``families.py`` gives each family's ratio over its nearest; this script splits the family's call
into its parts and times each part beside the nearest in turns (CPU time of one thread, the
median of the turns), all in float32 on the registry cases' inputs at T, H, K = V = 64:

- GSA and ABC (nearest GLA, M = K = 64 slots): the whole call, pass 1 (the key memory's chunk
  form, ``slots.slot_scores``), pass 2 (GLA itself on the slot scores' softmax, ``linear_attention``
  with the per-slot gate) and, for ABC, its cumulative-softmax control (``slots.additive_gate``).
- CyFA (nearest scalar decay, M = 6 slots): the whole call, and its two memories alone (the two
  scalar-decay passes on the very tensors the call hands them).

    PYTHONPATH=src python benchmarks/families_parts.py                 # T 16,384, H 8
    PYTHONPATH=src python benchmarks/families_parts.py --T 4096 --H 2 --turns 3
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from linattn import registry
from linattn.ops import cyfa as cyfa_module
from linattn.ops import slots
from linattn.ops.linear_attention import linear_attention


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _turns(parts: dict, turns: int) -> dict[str, float]:
    for run in parts.values():
        run()  # warm-up
    times = {name: [] for name in parts}
    for _ in range(turns):
        for name, run in parts.items():
            start = time.process_time()
            run()
            times[name].append(time.process_time() - start)
    return {name: _median(t) for name, t in times.items()}


def _leaves(x: dict) -> dict:
    out = {}
    for name, t in x.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            out[name] = t.detach().requires_grad_()
        elif isinstance(t, tuple):
            out[name] = tuple(s.detach().requires_grad_() for s in t)
    return out


def _loss(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.sum()
    return sum(_loss(t) for t in out if t is not None)


def _modes(call, leaves: list[torch.Tensor]):
    """(forward, forward + backward) of ``call`` (the sum of every output as the loss)."""

    def forward():
        with torch.no_grad():
            call()

    def forward_backward():
        for t in leaves:
            t.grad = None
        _loss(call()).backward()

    return forward, forward_backward


def _flat(x: dict) -> list[torch.Tensor]:
    return [s for t in x.values() for s in (t if isinstance(t, tuple) else (t,))]


def slot_parts(name: str, T: int, H: int, turns: int) -> None:
    entry, nearest = registry.get(name), registry.get("gla")
    x = entry.case.inputs(1, T, H, 64, 64, seed=0, dtype=torch.float32)
    xn = nearest.case.inputs(1, T, H, 64, 64, seed=0, dtype=torch.float32)
    lx, ln = _leaves(x), _leaves(xn)
    with torch.no_grad():  # the passes' own inputs, as the call makes them
        s, g = (x["s"], x["g"]) if "g" in x else slots.additive_gate(x["s"])
        scores, _ = slots.slot_scores(x["q"], x["k"], s, g, 64**-0.5, 64, x["S0"][0], None)
        p = torch.softmax(scores, -1)
    inputs = dict(q=x["q"], k=x["k"], v=x["v"], s=s, g=g, p=p, Sk=x["S0"][0], Sv=x["S0"][1])
    own = {n: t.detach().clone().requires_grad_() for n, t in inputs.items()}
    calls = {
        "gla (nearest)": (lambda: nearest.case.call({**xn, **ln}, "chunk", 64, 64**-0.5), ln),
        name: (lambda: entry.case.call({**x, **lx}, "chunk", 64, 64**-0.5), lx),
        "pass 1 (slot_scores)": (lambda: slots.slot_scores(
            own["q"], own["k"], own["s"], own["g"], 64**-0.5, 64, own["Sk"], None), own),
        "pass 2 (GLA on the scores)": (lambda: linear_attention(
            own["p"], own["s"], own["v"], own["g"], scale=1.0, initial_state=own["Sv"],
            mode="chunk", output_final_state=True), own),
    }  # fmt: skip
    if "g" not in x:
        logits = x["s"].detach().requires_grad_()
        calls["control (additive_gate)"] = (lambda: slots.additive_gate(logits), {"s": logits})
    for index, mode in ((0, "fwd"), (1, "fwd+bwd")):
        parts = {n: _modes(c, _flat(leaves))[index] for n, (c, leaves) in calls.items()}
        times = _turns(parts, turns)
        base = times["gla (nearest)"]
        for n, t in times.items():
            print(f"| {name} | {mode} | {n} | {t * 1e3:.1f} | {t / base:.2f} |", flush=True)


def cyfa_parts(T: int, H: int, turns: int) -> None:
    entry, nearest = registry.get("cyfa"), registry.get("scalar_decay")
    x = entry.case.inputs(1, T, H, 64, 64, seed=0, dtype=torch.float32)
    xn = nearest.case.inputs(1, T, H, 64, 64, seed=0, dtype=torch.float32)
    lx, ln = _leaves(x), _leaves(xn)
    recorded = []
    memory = cyfa_module._memory

    def record(*args, **kw):  # the memories' own inputs, copied as leaves
        recorded.append(([a.detach().clone().requires_grad_(a.requires_grad)
                          if isinstance(a, torch.Tensor) else a for a in args], kw))  # fmt: skip
        return memory(*args, **kw)

    cyfa_module._memory = record
    try:
        entry.case.call({**x, **lx}, "chunk", 64, 64**-0.5)
    finally:
        cyfa_module._memory = memory
    memories = [t for args, _ in recorded for t in args if isinstance(t, torch.Tensor)]
    calls = {
        "scalar_decay (nearest)": (lambda: nearest.case.call({**xn, **ln}, "chunk", 64, 64**-0.5),
                                   _flat(ln)),
        "cyfa": (lambda: entry.case.call({**x, **lx}, "chunk", 64, 64**-0.5), _flat(lx)),
        "its two memories alone": (lambda: [memory(*a, **kw) for a, kw in recorded], memories),
    }  # fmt: skip
    for index, mode in ((0, "fwd"), (1, "fwd+bwd")):
        parts = {n: _modes(c, [t for t in leaves if t.requires_grad])[index]
                 for n, (c, leaves) in calls.items()}  # fmt: skip
        times = _turns(parts, turns)
        base = times["scalar_decay (nearest)"]
        for n, t in times.items():
            print(f"| cyfa | {mode} | {n} | {t * 1e3:.1f} | {t / base:.2f} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--H", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--mechanisms", default="gsa,abc,cyfa")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"T {args.T:,}, H {args.H}, K = V = 64, float32, 1 thread, {args.turns} turns, CPU "
          f"time (median); torch {torch.__version__}")  # fmt: skip
    print("| mechanism | pass | part | ms | over the nearest |")
    print("|---|---|---|---|---|")
    for name in args.mechanisms.split(","):
        if name == "cyfa":
            cyfa_parts(args.T, args.H, args.turns)
        else:
            slot_parts(name, args.T, args.H, args.turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
