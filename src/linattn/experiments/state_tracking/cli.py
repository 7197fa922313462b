"""State tracking: parity, modular sums and permutation word problems, trained and length-tested.

What a fixed memory can compute while it reads (Grazzi et al., ICLR 2025; Siems et al., 2025):
every mechanism is trained on words of up to 64 group elements, labelled at every token with the
running product, and tested on words up to 512 long. Transitions with eigenvalues in [0, 1] (linear
attention, decays, DeltaNet with beta in [0, 1]) cannot flip a sign; DeltaNet with beta in [0, 2]
can (a reflection), and DeltaProduct's n_h writes per token compose larger groups. Presets:

  smoke    seconds: two tasks, three mechanisms, 2 steps (the tests run it)
  default  parity, mod3 and S3 on every mechanism, A5 on DeltaNet [0, 2] and DeltaProduct
           n_h = 2, 3, 4; 3 seeds, 1,000 steps after a curriculum over lengths: about 20
           minutes on 2 free cores, plus the first compile of the CPU kernels
  paper    every task, one and two layers, 5 seeds, the papers' widths and steps (for a GPU)

Results are appended to a JSON lines file (one object per cell; schema in
linattn.experiments.state_tracking.sweep); a rerun reuses finished cells and resumes an interrupted
one from its checkpoint. The table and figure are computed from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

import torch

from linattn.experiments._args import nonnegative_int, output_dir, output_file, positive_int
from linattn.experiments.state_tracking.results import aggregate, plot_results, results_table
from linattn.experiments.state_tracking.sweep import MECHANISMS, PRESETS, run_sweep
from linattn.experiments.state_tracking.tasks import GROUPS

MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit integer


def seed_number(text: str) -> int:
    """An argparse type: a seed, an integer in [0, 2**63 - 1] (torch's generator's range; a
    larger one failed in torch.manual_seed, after the first cells had run)."""
    value = nonnegative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer <= 2**63 - 1, got {value}")
    return value


def thread_count(text: str) -> int:
    """An argparse type: torch threads per worker, in [1, the CPUs here] (torch's thread pool
    is not bounded itself: 100,000 threads crashed the process inside torch)."""
    value = positive_int(text)
    cpus = os.cpu_count() or 1
    if value > cpus:
        raise argparse.ArgumentTypeError(f"expected at most the {cpus} CPUs here, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn state-tracking``."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default",
                        help="default: default")  # fmt: skip
    parser.add_argument("--tasks", nargs="+", choices=list(GROUPS), metavar="TASK",
                        help=f"subset of: {', '.join(GROUPS)}")  # fmt: skip
    parser.add_argument("--mechanisms", nargs="+", choices=list(MECHANISMS), metavar="NAME",
                        help=f"subset of: {', '.join(MECHANISMS)}")  # fmt: skip
    parser.add_argument(
        "--seeds", nargs="+", type=seed_number, metavar="S", help="seeds (default: 0 1 2)"
    )
    parser.add_argument("--steps", type=int, help="training steps per cell (default: preset's)")
    parser.add_argument("--results", default="runs/state-tracking.jsonl",
                        help="JSON lines file to append to")  # fmt: skip
    parser.add_argument("--plot", default="runs/state-tracking.png",
                        help="PNG to write ('none': no plot)")  # fmt: skip
    parser.add_argument("--checkpoint-dir", default="runs/state-tracking-checkpoints",
                        help="where cells save and resume ('none': no checkpoints)")  # fmt: skip
    parser.add_argument("--fresh", action="store_true", help="retrain every cell of the preset")
    parser.add_argument("--workers", type=int, help="cells trained at once (default: preset's)")
    parser.add_argument("--threads", type=thread_count, help="torch threads per worker (default 1; "
                        "at most the CPUs here)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_preset(args: argparse.Namespace):
    """The chosen preset with the options' overrides (validated by ``Preset``)."""
    preset = PRESETS[args.preset]
    changes = {}
    if args.tasks:
        changes["tasks"] = tuple(args.tasks)
    if args.mechanisms:
        changes["mechanisms"] = tuple(args.mechanisms)
        changes["extra_layers"] = {
            m: n for m, n in preset.extra_layers.items() if m in args.mechanisms
        }
        changes["task_mechanisms"] = {
            t: tuple(m for m in ms if m in args.mechanisms)
            for t, ms in preset.task_mechanisms.items()
        }
    if args.seeds:
        changes["seeds"] = tuple(args.seeds)
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        warmup = min(preset.train.warmup_steps, args.steps // 10)
        changes["train"] = replace(preset.train, steps=args.steps, warmup_steps=warmup)
        if preset.curriculum_every:  # the same share of the steps at each length
            every = preset.curriculum_every * args.steps // preset.train.steps
            changes["curriculum_every"] = max(1, every)
    if args.workers is not None:
        changes["workers"] = args.workers
    return replace(preset, **changes)


def run(args: argparse.Namespace) -> int:
    """Train the preset's cells, print the table (or JSON), write the figure."""
    results_path = output_file("--results", args.results)
    plot_path = None if args.plot == "none" else output_file("--plot", args.plot)
    checkpoint_dir = (
        None
        if args.checkpoint_dir == "none"
        else output_dir("--checkpoint-dir", args.checkpoint_dir)
    )
    if plot_path is not None:  # matplotlib found before any training, not after every cell
        from linattn.figures import style

        try:
            style.pyplot()
        except ImportError as error:
            raise ValueError(f"--plot: {error}; or pass --plot none") from None
    preset = build_preset(args)
    threads = args.threads or 1
    if preset.workers == 1:
        torch.set_num_threads(threads)
    log = (lambda text: None) if args.json else print
    log(f"state tracking preset {preset.name!r}: {preset.description}")
    log(
        f"{len(preset.cells())} cells: tasks {list(preset.tasks)}, seeds {list(preset.seeds)}; "
        f"d_model {preset.d_model}, {preset.train.steps} steps of {preset.train.batch_size} at "
        f"lr {preset.train.lr:g}, trained at {preset.train_len} tokens, tested at "
        f"{list(preset.test_lens)}; {preset.workers} worker(s) x {threads} thread(s)"
    )
    started, cpu = time.perf_counter(), time.process_time()
    rows = run_sweep(preset, results_path=results_path, checkpoint_dir=checkpoint_dir,
                     fresh=args.fresh, progress=not args.no_progress and not args.json,
                     threads_per_worker=threads, log=log)  # fmt: skip
    wall = time.perf_counter() - started
    summaries = aggregate(rows)
    if plot_path is not None:
        plot_results(summaries, plot_path, title=f"State tracking (preset {preset.name})")
    if args.json:
        print(json.dumps({"preset": preset.name, "wall_seconds": wall, "summaries": summaries}))
        return 0
    print()
    print(results_table(summaries))
    cell_cpu = sum(r.get("cpu_seconds", 0.0) for r in rows)
    print(
        f"\nwall time {wall:.0f} s ({wall / 60:.1f} min); CPU time of the cells {cell_cpu:.0f} s "
        f"({cell_cpu / 120:.1f} min on 2 free cores), of this process "
        f"{time.process_time() - cpu:.0f} s; results in {args.results}"
    )
    if plot_path is not None:
        print(f"plot: {plot_path}")
    return 0
