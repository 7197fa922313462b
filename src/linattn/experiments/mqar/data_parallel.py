"""Data-parallel training of the recall benchmark's models with ``DistributedDataParallel``.

``torchrun --nproc-per-node N -m linattn.experiments.mqar.data_parallel --preset smoke
--mechanism deltanet`` trains the same model on the same batches as one process would: every rank
draws the global batch of step s (``mqar.data.train_batch(task, batch_size, seed, s)``, a pure
function of the seed and the step) and keeps its ``batch_size / N`` rows, so the global batch is
the single-process batch.

The loss each rank back-propagates is ``N * (sum of its query cross-entropies) / (queries in the
global batch)``. DDP averages gradients over the N ranks, so the gradient every rank applies is
the gradient of the global batch's mean loss, exactly, whatever the split of the queries (with a
mixture of key-value counts, ``TrainConfig.train_n_kv``, the shards hold different numbers of
queries). The logged loss is that global mean (an all-reduce of the ranks' sums). Optimiser,
schedule and clipping are the MQAR loop's (``mqar.train.make_optimizer``, ``learning_rate``,
``grad_clip``); the gradients are identical on every rank after DDP's all-reduce, so every rank
takes the same step. With one process (no process group) the same function is the plain loop.

Differences from ``mqar.train.train``: no checkpoints and no early stop (a run is a fixed number
of steps); the loss is kept in the model's dtype (float64 models train in float64, which the
tests use for a tight comparison), where the MQAR loop computes it in float32.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from linattn.distributed import collectives
from linattn.experiments.mqar import data
from linattn.experiments.mqar import train as mqar_train
from linattn.experiments.mqar.data import IGNORE_INDEX, MQARTask
from linattn.experiments.mqar.train import TrainConfig


@dataclass
class DataParallelResult:
    """The loss of every step (global batch mean), the final held-out accuracy, time, ranks."""

    losses: list[float]
    accuracy: float
    seconds: float
    world_size: int
    evals: list[dict] = field(default_factory=list)


def _shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rows rank*b .. (rank+1)*b - 1 of the global batch [batch_size, T], b = batch_size / world."""
    b = x.shape[0] // world
    return x[rank * b : (rank + 1) * b]


def train_data_parallel(
    model: nn.Module,
    task: MQARTask,
    config: TrainConfig,
    *,
    group: dist.ProcessGroup | None = None,
    evaluate: bool = True,
) -> DataParallelResult:
    """Train ``model`` (ids [B, T] -> logits [B, T, vocab]) on MQAR across the ranks of ``group``.

    Without an initialised process group this is the single-process run. ``config.batch_size`` is
    the global batch; it must be divisible by the number of ranks. Every rank must build the model
    the same way (DDP also broadcasts rank 0's parameters at the start). The held-out evaluation
    (``config.eval_examples``, after the last step) runs on every rank on its own replica.
    """
    if not isinstance(task, MQARTask):
        raise TypeError(f"task must be an MQARTask, got {type(task).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = collectives.rank_and_size(group) if distributed else (0, 1)
    if config.batch_size % world:
        raise ValueError(
            f"the global batch_size {config.batch_size} must be divisible by the number of ranks "
            f"{world}"
        )
    wrapped = DistributedDataParallel(model, process_group=group) if distributed else model
    device = next(model.parameters()).device
    optimizer = mqar_train.make_optimizer(model, config)
    losses: list[float] = []
    started = time.perf_counter()
    model.train()
    for step in range(config.steps):
        inputs, labels = data.train_batch(
            task, config.batch_size, config.seed, step, config.train_n_kv
        )
        inputs, labels = inputs.to(device), labels.to(device)
        queries = int((labels != IGNORE_INDEX).sum())  # in the global batch
        x, y = _shard(inputs, rank, world), _shard(labels, rank, world)
        logits = wrapped(x)  # [b, T, vocab]
        ce_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            y.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        for group_ in optimizer.param_groups:
            group_["lr"] = mqar_train.learning_rate(step, config)
        optimizer.zero_grad(set_to_none=True)
        (ce_sum * (world / queries)).backward()  # DDP divides by world: the global mean's grad
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        total = ce_sum.detach()
        if distributed:
            total = collectives.all_reduce_sum(total.reshape(1), group, name="loss")[0]
        loss = float(total) / queries
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(f"training loss is {loss} at step {step}; lower the lr")
        losses.append(loss)
    seconds = time.perf_counter() - started
    if distributed:
        # Drop DDP's reducer (it holds gloo work objects) while the process group is alive and
        # every rank is past its last all-reduce; left to the interpreter's exit, its destruction
        # can abort the process ("terminate called without an active exception").
        collectives.barrier(group)
        del wrapped
        gc.collect()
    evals = []
    accuracy = float("nan")
    if evaluate:
        eval_inputs, eval_labels = data.eval_set(task, config.eval_examples, config.seed)
        accuracy, eval_loss = mqar_train.evaluate(
            model, eval_inputs.to(device), eval_labels.to(device), config.eval_batch_size
        )
        evals.append({"step": config.steps, "accuracy": accuracy, "loss": eval_loss})
    return DataParallelResult(losses, accuracy, seconds, world, evals)


def build(args: argparse.Namespace) -> tuple[nn.Module, MQARTask, TrainConfig]:
    """The model, task and training configuration that the command-line options describe."""
    from linattn.experiments.mqar.sweep import MECHANISMS, PRESETS, build_model

    if args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {args.preset!r}")
    if args.mechanism not in MECHANISMS:
        raise ValueError(f"--mechanism must be one of {sorted(MECHANISMS)}, got {args.mechanism!r}")
    preset = PRESETS[args.preset]
    overrides = {
        name: getattr(args, name)
        for name in ("steps", "batch_size", "lr", "seed", "train_n_kv")
        if getattr(args, name) is not None
    }
    # The mechanism's own recipe in the preset (its steps; its lr when it has one rather than a
    # sweep), then the command line's overrides.
    recipe = preset.train_for(args.mechanism)
    lrs = preset.lrs_for(args.mechanism)
    own = {"lr": lrs[0] if len(lrs) == 1 else recipe.lr}
    config = dataclasses.replace(recipe, **{**own, **overrides})
    width = args.width if args.width is not None else preset.widths[0]
    torch.manual_seed(config.seed)  # the same initial parameters on every rank
    model = build_model(args.mechanism, width, preset)
    return model.to(getattr(torch, args.dtype)), preset.task, config


def configure(parser: argparse.ArgumentParser) -> None:
    """Options: an MQAR preset and mechanism, overrides, dtype, output file, timeout."""
    parser.add_argument("--preset", default="smoke", help="an MQAR preset (default smoke)")
    parser.add_argument("--mechanism", default="deltanet", help="an MQAR mechanism")
    parser.add_argument("--width", type=int, default=None, help="d_model (default: preset's)")
    parser.add_argument("--steps", type=int, default=None, help="default: the preset's for it")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch size")
    parser.add_argument("--lr", type=float, default=None, help="default: the preset's for it")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--train-n-kv",
        type=int,
        nargs="+",
        default=None,
        help="train on this mixture of key-value counts (equal shares of each batch)",
    )
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    parser.add_argument(
        "--loss-file", default=None, help="rank 0 writes the loss curve here (JSON)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout, s")
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="default: nccl if CUDA is available (one GPU per rank, LOCAL_RANK), else gloo",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun (or plain python for one process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    distributed = "RANK" in os.environ  # set by torchrun
    device = torch.device("cpu")
    if distributed:
        collectives.init_process_group(args.backend, timeout=args.timeout)
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    try:
        model, task, config = build(args)
        result = train_data_parallel(model.to(device), task, config, evaluate=not args.no_eval)
        if (dist.get_rank() if distributed else 0) == 0:
            print(
                f"{result.world_size} rank(s), {config.steps} steps, global batch "
                f"{config.batch_size}: first loss {result.losses[0]:.6f}, last loss "
                f"{result.losses[-1]:.6f}, held-out accuracy {result.accuracy:.3f}, "
                f"{result.seconds:.1f} s"
            )
            if args.loss_file:
                with open(args.loss_file, "w") as f:
                    json.dump(dataclasses.asdict(result), f)
    finally:
        # Also after an error: the process then ends with Python's exit status, not an abort.
        if distributed and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
