"""Multi-query associative recall (MQAR): train every mechanism, table and plot accuracy vs state.

The recall benchmark of Arora et al. (2023, "Zoology"): each sequence lists key-value pairs, then
asks for the keys again; a model must answer with the values. Fixed-state mechanisms forget (spec
6.3, 7.3); the delta rule uses the same state better (7, 10). Presets:

  smoke    seconds: every mechanism trains a few steps (the tests run it)
  cpu      T=64, 8 pairs, width 64; 3 seeds x 3 lrs x 2 fillers, 500 steps for every
           mechanism: about 50 minutes on 2 quiet CPU cores, 2 workers
  zoology  the paper's scale: V=8192, T=512, 64 pairs, widths 64-512, an lr sweep (for a GPU)

Results are appended to a JSON lines file (one object per filler, mechanism, width and seed; schema
in linattn.experiments.mqar.sweep); a rerun reuses finished rows and resumes interrupted training
from its checkpoint, so an interrupted sweep can simply be started again. The printed tables give
the mean, min and max over the seeds and how many solved the task (accuracy >= 0.9).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from linattn.experiments._args import check_memory, nonnegative_int, output_dir, output_file
from linattn.experiments.mqar.data import FILLERS, filler_name
from linattn.experiments.mqar.sweep import (
    MECHANISMS,
    PRESETS,
    Preset,
    plot_results,
    results_table,
    run_sweep,
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn mqar``."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="default: cpu")
    parser.add_argument("--mechanisms", nargs="+", choices=list(MECHANISMS), metavar="NAME",
                        help=f"subset of: {', '.join(MECHANISMS)} (default: all)")  # fmt: skip
    parser.add_argument("--widths", nargs="+", type=int, metavar="D", help="model widths d_model")
    parser.add_argument("--steps", type=int, help="training steps per run (default: the preset's)")
    parser.add_argument("--batch-size", type=int, help="sequences per step (default: preset's)")
    parser.add_argument("--seq-len", type=int, help="sequence length T (even; default: preset's)")
    parser.add_argument("--n-kv", type=int, help="key-value pairs per sequence (<= T/4)")
    parser.add_argument("--vocab-size", type=int, help="vocabulary size V (> T)")
    parser.add_argument("--fillers", nargs="+", choices=FILLERS,
                        help="tokens between the queries, one or both: blank (token 0) or random "
                        "from the whole vocabulary (Zoology's random_non_queries; with a small "
                        "vocabulary keys then recur in the filler); default: the preset's "
                        "(cpu: both)")  # fmt: skip
    parser.add_argument("--lr", nargs="+", type=float, metavar="LR",
                        help="learning rates to sweep, the same for every mechanism; each seed "
                        "reports its best")  # fmt: skip
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", nargs="+", type=nonnegative_int, metavar="SEED",
                       help="seeds for data and initialisation, one run each (default: the "
                       "preset's; cpu: 0 1 2)")  # fmt: skip
    seeds.add_argument("--seed", type=nonnegative_int, help="one seed (the same as --seeds SEED)")
    parser.add_argument("--results", default="runs/mqar.jsonl", help="JSON lines file to append to")
    parser.add_argument("--plot", default="runs/mqar.png", help="PNG to write ('none': no plot)")
    parser.add_argument("--checkpoint-dir", default="runs/mqar-checkpoints",
                        help="where runs save and resume ('none': no checkpoints)")  # fmt: skip
    parser.add_argument("--fresh", action="store_true",
                        help="retrain even if this sweep has results or checkpoints")  # fmt: skip
    parser.add_argument("--threads", type=int,
                        help="torch threads (per worker with --workers > 1, default 1; "
                        "otherwise default: torch's choice)")  # fmt: skip
    parser.add_argument("--workers", type=int,
                        help="pairs trained at once, one process each (default: the preset's; "
                        "cpu: 2, one per core)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def memory_needed(preset: Preset) -> int:
    """Bytes of the largest float32 tensors of one training step in every worker (a lower bound
    of the peak): the logits and their gradient [batch, T, vocab], and the embedding with its
    gradient and Adam's two moments [vocab, width] at the widest width."""
    t, batch = preset.task, preset.train.batch_size
    logits = 2 * batch * t.seq_len * t.vocab_size
    embedding = 4 * t.vocab_size * max(preset.widths)
    return 4 * preset.workers * (logits + embedding)


def size_options(preset: Preset) -> str:
    """The size settings (the preset's, or the options that replaced them) for the message."""
    t = preset.task
    return (
        f"--seq-len {t.seq_len} --vocab-size {t.vocab_size} --batch-size "
        f"{preset.train.batch_size} --widths {max(preset.widths)} --workers {preset.workers}"
    )


def run(args: argparse.Namespace) -> int:
    """Build the preset (with overrides), run the sweep, print the table, write the plot."""
    # Every output path first: a bad one must fail now, not after minutes of training.
    results_path = output_file("--results", args.results)
    plot_path = None if args.plot == "none" else output_file("--plot", args.plot)
    checkpoint_dir = (
        None
        if args.checkpoint_dir == "none"
        else output_dir("--checkpoint-dir", args.checkpoint_dir)
    )
    preset = PRESETS[args.preset]
    train_overrides = {}
    if args.steps is not None:
        train_overrides["steps"] = args.steps
        train_overrides["warmup_steps"] = min(preset.train.warmup_steps, max(args.steps // 10, 0))
    if args.batch_size is not None:
        train_overrides["batch_size"] = args.batch_size
    task_overrides = {
        name: value
        for name, value in (
            ("seq_len", args.seq_len), ("n_kv", args.n_kv), ("vocab_size", args.vocab_size)
        )
        if value is not None
    }  # fmt: skip
    # Task and training settings are validated here, before any model is built or trained.
    preset = replace(
        preset,
        task=replace(preset.task, **task_overrides),
        train=replace(preset.train, **train_overrides),
        mechanisms=tuple(args.mechanisms or preset.mechanisms),
        widths=tuple(args.widths or preset.widths),
        lrs=tuple(args.lr or preset.lrs),
        # --lr replaces every mechanism's lrs, the per-mechanism choices of the preset included
        mechanism_lrs={} if args.lr else preset.mechanism_lrs,
        # --steps likewise replaces the per-mechanism step counts
        mechanism_steps={} if args.steps is not None else preset.mechanism_steps,
        workers=preset.workers if args.workers is None else args.workers,
        seeds=tuple(args.seeds or ([args.seed] if args.seed is not None else preset.seeds)),
        fillers=tuple(args.fillers or preset.fillers),
    )
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    check_memory(size_options(preset), memory_needed(preset))
    parallel = preset.workers > 1
    if args.threads is not None and not parallel:
        torch.set_num_threads(args.threads)
    threads = (args.threads or 1) if parallel else torch.get_num_threads()
    t = preset.task
    print(f"MQAR preset {preset.name!r}: {preset.description}")
    print(
        f"task: vocab {t.vocab_size}, seq_len {t.seq_len}, {t.n_kv} key-value pairs, "
        f"{' and '.join(preset.filler_names())} fillers; widths {list(preset.widths)}; "
        f"seeds {list(preset.seeds)}; "
        + (
            f"{preset.workers} workers x {threads} thread(s)"
            if parallel
            else f"{threads} thread{'' if threads == 1 else 's'}"
        )
    )
    print(f"budget: {budget_text(preset)}", flush=True)
    started = time.perf_counter()
    rows = run_sweep(preset, results_path=results_path, checkpoint_dir=checkpoint_dir,
                     fresh=args.fresh, progress=not args.no_progress,
                     threads_per_worker=threads)  # fmt: skip
    wall = time.perf_counter() - started
    for filler in preset.filler_names():
        print(f"\n{filler} fillers (over seeds {list(preset.seeds)}):")
        print(results_table([row for row in rows if filler_name(row) == filler]))
    cell_cpu = sum(row.get("cpu_seconds", 0.0) for row in rows)
    print(
        f"\nwall time {wall:.0f} s ({wall / 60:.1f} min); CPU time of the cells {cell_cpu:.0f} s "
        f"({cell_cpu / 120:.1f} min on 2 free cores); results appended to {args.results}"
    )
    if plot_path is not None:
        title = f"MQAR: T={t.seq_len}, {t.n_kv} pairs, vocab {t.vocab_size}"
        print(f"plot: {plot_results(rows, plot_path, title=title)}")
    return 0


def budget_text(preset: Preset) -> str:
    """The training budget and stopping rule of a preset, as the output states them."""
    stop = preset.train.stop_accuracy
    rule = (
        f"a run stops once its held-out accuracy (every {preset.train.eval_every} steps) reaches "
        f"{stop:g}, and the lrs after one that did are skipped"
        if stop is not None
        else "no early stop"
    )
    same = "" if preset.mechanism_steps else " for every mechanism"
    return (
        f"{steps_text(preset)} steps of {preset.train.batch_size} sequences{same} "
        f"(cosine schedule); lr sweep {lr_text(preset)}, the best per seed; {rule}"
    )


def lr_text(preset: Preset) -> str:
    """The learning rates of a preset, e.g. ``[0.003] (softmax: [0.01])``."""
    own = {m: list(preset.lrs_for(m)) for m in preset.mechanisms if m in preset.mechanism_lrs}
    return _with_own(list(preset.lrs), own)


def steps_text(preset: Preset) -> str:
    """The training steps of a preset, e.g. ``1000 (kda: 2000)``."""
    own = {m: preset.train_for(m).steps for m in preset.mechanisms if m in preset.mechanism_steps}
    return _with_own(preset.train.steps, own)


def _with_own(common: object, own: dict[str, object]) -> str:
    """``common``, then the mechanisms that have their own value: ``common (name: value; ...)``."""
    listed = "; ".join(f"{m}: {value}" for m, value in own.items())
    return f"{common}" + (f" ({listed})" if own else "")
