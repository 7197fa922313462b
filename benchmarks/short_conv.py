"""The layers' short convolution: the fused C++ kernels against PyTorch's, in one process.

    PYTHONPATH=src python benchmarks/short_conv.py            # the shapes below, then MQAR steps
    PYTHONPATH=src python benchmarks/short_conv.py --quick    # a dry run: seconds

``linattn.ops.conv.short_conv`` (the causal depthwise convolution of W taps and its SiLU, on
[B, T, C] rows) forward plus backward, float32, against the same formula in PyTorch
(``causal_conv1d``: a transpose, ``F.conv1d`` with groups = C, ``F.silu``), in turns, at the MQAR
models' shapes (B 32, T 64) and a layer's (C 2,048 at T 4,096 and B 4 x T 512; C 512 at T 16,384);
then one training step (forward, backward, AdamW) of the MQAR ``cpu`` preset's models with either
convolution, in turns. The medians of the turns and their ratio; CPU time of this process
(``time.process_time``), so that a shared machine's other jobs count less.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

import linattn.ops.conv as conv
from linattn.experiments import _timing
from linattn.ops import _native

SHAPES = [(32, 64, 64, 3), (32, 64, 192, 4), (1, 4096, 2048, 4), (4, 512, 2048, 4),
          (1, 16384, 512, 4)]  # fmt: skip
MECHANISMS = ["deltanet", "gated_deltanet", "kda", "mamba2", "hybrid"]


def in_turns(fns: list[Callable[[], object]], turns: int, calls: int = 1) -> list[float]:
    """The median CPU seconds per call of each of fns (``calls`` calls a sample), in turns."""
    for fn in fns:
        fn()  # warm up
    batches = [lambda fn=fn: [fn() for _ in range(calls)] for fn in fns]
    return [t / calls for t in _timing.medians_in_turns(batches, turns)]


def with_conv(fused: bool, fn: Callable[[], object]) -> Callable[[], object]:
    """fn with the fused kernels (the default) or with PyTorch's convolution."""

    def call():
        original = conv._fused_applies
        if not fused:
            conv._fused_applies = lambda *args: False
        try:
            return fn()
        finally:
            conv._fused_applies = original

    return call


def convolutions(turns: int, shapes: list[tuple[int, int, int, int]]) -> None:
    print("forward + backward, ms (B, T, C, W): PyTorch / fused = speed-up")
    for B, T, C, W in shapes:
        x = torch.randn(B, T, C, requires_grad=True)
        w = torch.randn(C, W, requires_grad=True)
        d_y = torch.randn(B, T, C)

        def both(x=x, w=w, d_y=d_y):
            conv.short_conv(x, w)[0].backward(d_y)

        old, new = in_turns([with_conv(False, both), with_conv(True, both)], turns)
        print(f"  {B:>2} {T:>6} {C:>5} {W}: {1e3 * old:8.2f} / {1e3 * new:7.2f} = {old / new:.1f}x")


def training_steps(turns: int) -> None:
    from linattn.experiments.mqar import sweep

    print("MQAR cpu preset, one training step (B 32, T 64, d_model 64), ms: PyTorch conv / fused")
    preset = sweep.PRESETS["cpu"]
    for mechanism in MECHANISMS:
        torch.manual_seed(0)
        model = sweep.build_model(mechanism, 64, preset)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, preset.task.vocab_size, (32, preset.task.seq_len))

        def step(model=model, opt=opt, tokens=tokens):
            opt.zero_grad()
            out = model(tokens)
            logits = out[0] if isinstance(out, tuple) else out
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
            opt.step()

        old, new = in_turns([with_conv(False, step), with_conv(True, step)], turns, calls=4)
        print(f"  {mechanism:<15} {1e3 * old:7.1f} / {1e3 * new:7.1f}  ratio {new / old:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="2 turns, the MQAR shapes only, no training steps")  # fmt: skip
    args = parser.parse_args(argv)
    if not _native.available():
        print(f"the fused CPU code is unavailable: {_native.reason()}", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    turns = 2 if args.quick else args.turns
    print(f"{args.threads} thread(s), CPU time, medians of {turns} turns")
    _timing.use_clock("cpu")
    try:
        convolutions(turns, SHAPES[:2] if args.quick else SHAPES)
        if not args.quick:
            training_steps(turns)
    finally:
        _timing.use_clock("wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
