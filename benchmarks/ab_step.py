"""A/B timing of the decoding step's C++ kernels of two commits in ONE process, in turns.

    python benchmarks/ab_step.py OLD_REV [--batch 8] [--shape qwen3_next] [--turns 15]
        [--threads 1] [--states 1]

``ab_kernels.py``'s method for ``recurrent_step``: OLD_REV's ``csrc/`` is compiled
under the namespace ``linattn_ab_old`` beside the working tree's kernels, and each turn times a
batch of calls of the in-place pass over the state (``S.mul_(1.0)``, ``decode.py``'s yardstick),
the old step and the new step on the same inputs (``decode.token``), the fused ops called
directly. ``--states L`` steps L states in turn (L = 4 at B 8 or 36 at B 1 is 64-72 MiB at the
Qwen3-Next shape, more than a 32 MiB L3: the states cold, as a model's layers are; 1: one state
stepped again and again, hot, as ``decode.py`` times it). Printed per mechanism: the medians of
the three, the median of each turn's old / pass, new / pass and new / old ratios, and the
relative difference of one step's output and state between the two (0: the same bits).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_kernels import load_old  # noqa: E402
from decode import MECHANISMS, SHAPES, in_turns, step_args, token  # noqa: E402

from linattn.experiments._timing import paired_ratios  # noqa: E402
from linattn.ops import _native  # noqa: E402


def stepping(op: object, states: list[torch.Tensor], args: tuple) -> Callable[[], None]:
    """A call of ``op`` on each of ``states`` in turn, with the step's other arguments."""

    def call() -> None:
        for S in states:
            op(S, *args)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", help="the old commit (a git revision)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3_next")
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--states", type=int, default=1, help="states stepped in turn (cold)")
    args = parser.parse_args()
    if not _native.available():
        sys.exit(f"the fused kernels are not built: {_native.reason()}")
    old = load_old(args.old).recurrent_step.default
    new = torch.ops.linattn_native.recurrent_step.default
    torch.set_num_threads(args.threads)
    Hq, HV, K = SHAPES[args.shape]
    gen = torch.Generator().manual_seed(1)
    state = torch.randn(args.batch, HV, K, K, generator=gen) * 0.1
    calls = max(2, int(2e6 / state.numel() / args.states))  # about 2 M state numbers a sample
    print(
        f"{args.shape} B {args.batch}, {args.threads} thread(s), {args.states} state(s), "
        f"old {args.old} against the working tree"
    )
    for mechanism in MECHANISMS:
        x = token(mechanism, args.batch, Hq, HV, K)
        rest = step_args(x, K)
        inputs = (x["q"], x["k"], x["v"])
        # 1. The same bits? One step of each from the same state.
        s_old, s_new = state.clone(), state.clone()
        o_old, o_new = old(s_old, *inputs, *rest), new(s_new, *inputs, *rest)
        d_o = ((o_old - o_new).norm() / o_old.norm()).item()
        d_s = ((s_old - s_new).norm() / s_old.norm()).item()
        # 2. The pass, the old step and the new one, in turns.
        states = [[state.clone() for _ in range(args.states)] for _ in range(3)]

        def passes(own: list[torch.Tensor] = states[0]) -> None:
            for S in own:
                S.mul_(1.0)

        fns = [
            passes,
            stepping(old, states[1], inputs + rest),
            stepping(new, states[2], inputs + rest),
        ]
        samples = in_turns(fns, calls, args.turns)
        ms = [1e3 * statistics.median(s) for s in samples]
        ratio = [
            paired_ratios(a, b)["median"]
            for a, b in (
                (samples[1], samples[0]),
                (samples[2], samples[0]),
                (samples[2], samples[1]),
            )
        ]
        print(
            f"{mechanism:<13} pass {ms[0]:.4f} old {ms[1]:.4f} new {ms[2]:.4f} ms  "
            f"old/pass {ratio[0]:.2f} new/pass {ratio[1]:.2f} new/old {ratio[2]:.3f}  "
            f"output {d_o:.1e} state {d_s:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
