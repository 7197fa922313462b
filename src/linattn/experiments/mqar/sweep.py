"""MQAR sweep: every mechanism at several widths; table and plot of accuracy against state size.

Mechanisms (``MECHANISMS``; the mixer of each block of ``linattn.models.CausalLM``):

=================  ==========================================  ===================================
name               mixers                                      spec
=================  ==========================================  ===================================
softmax            softmax, softmax                            2 (state: the KV cache)
linear             linear, linear (elu + 1 features)           4, 5
taylor             taylor, taylor (Based, 2nd-order Taylor)    4
scalar_decay       scalar_decay x 2 (Mamba-2 / RetNet decay)   10
deltanet           deltanet, deltanet                          7, 8
gated_deltanet     gated_deltanet x 2                          10
kda                kda, kda (Kimi Delta Attention)             10
hybrid             kda, kda, kda, softmax                      10 (3:1 hybrid)
=================  ==========================================  ===================================

Every model has 2 blocks (mixer + MLP), as in Zoology, except the hybrid: a 3:1 interleave needs 4
blocks, so it has twice the depth (and about twice the parameters) at the same width; its state size
per layer is the mean over its 4 blocks, ``(3 kda + 1 KV cache) / 4``. The table lists parameters so
that this is visible.

State size (``state_numbers``): the numbers a block keeps between tokens at the end of a sequence
of ``seq_len`` tokens, from the model's cache accounting (``cache.numbers_per_block()`` after
running the sequence through ``model.new_cache``): ``H d_k d_v`` (plus normaliser and
short-convolution state) for the recurrent mechanisms, ``2 T H d_head`` (and the conv state) for
softmax attention's KV cache. Reported per layer (mean over the blocks).

Results (``results_path``, JSON lines, one object per (mechanism, width), appended when it
finishes): ``preset, mechanism, mixers, n_layers, d_model, n_heads, params, state_numbers (per
layer, mean over blocks), state_numbers_per_block, vocab_size, seq_len, n_kv, power_a, steps
(taken), max_steps, batch_size, lr (the best of the sweep), lr_sweep [{lr, accuracy,
best_accuracy, steps, seconds}], accuracy (final held-out accuracy at that lr), best_accuracy,
eval_loss, stopped_early, evals [{step, accuracy, loss}], seconds (training wall time summed over
the lr sweep, resumed pieces included), seed, threads, torch, config_hash, finished (UTC ISO
time)``. A rerun of the same sweep skips pairs whose ``config_hash`` is already in the file and
resumes an interrupted pair from its checkpoint.

Calibration of the ``cpu`` preset (measured 2026-11-30 on the 2-core machine, the other core busy
with benchmarks; 1 torch thread; T=128, 16 pairs, V=256, batch 32; milliseconds per training step
at d_model 32 / 64, chunk 32): softmax 68 / 125, linear 72 / 135, taylor 235 / 310, scalar_decay
101 / 170, deltanet 92-145 / 182, gated_deltanet 97 / 181, kda 149 / 245, hybrid (4 blocks) about
350 / 650. Step time is close to linear in the batch (deltanet d=32: 42 / 92-145 / 157 ms at batch
16 / 32 / 64). For the chunked forms, chunk 16, 32 and 64 cost about the same, 128 (one block) up
to 2x more; the recurrent form costs 2-7x the chunk form at T=128 (taylor 7x), so the preset keeps
chunk 32. One step of every (mechanism, width) pair costs about 3.1 s of one core, so ~15
minutes on 2 cores buys ~500 steps of 32 per pair (``workers=2``: two pairs at a time, one thread
each, the costliest first; per-pair numbers do not depend on the worker count). The steps were
chosen for that budget; a pair that reaches 0.99 stops (``stop_accuracy``) and frees its core.

Learning rates: softmax attention (with ``softmax_short_conv``) at the preset's task, d=64, a
600-step cosine at lr 1e-2: held-out accuracy 0.009, 0.012, 0.920, 0.998 at steps 100-400 (65 s);
d=32: 0.047, 0.258, 0.614, 0.678 at steps 300-600. At lr 3e-3 softmax was still at 0.022 at step
600 (earlier notes). So softmax gets 1e-2 (``mechanism_lrs``); every other mechanism gets 3e-3,
the rate of the earlier notes' only DeltaNet escape (1e-2 did no better in the probes below),
elu+1 included: the same recipe as the delta family, not a handicap.

What the budget does not reach: no recurrent mechanism leaves the MQAR plateau within it, and the
delta family does not reach the literature's accuracy. Probes of DeltaNet (1 thread, batch 32,
T=128, 16 pairs, seed 0; held-out accuracy, chance = 1/128 ~ 0.008; mean training loss against ln
128 = 4.85): d=64 lr 3e-3 with a 3000-step cosine: <= 0.010 to step 1500 (training loss 4.82);
1000-step cosine: 0.013 at 800; lr 1e-2: 0.015 at 500; batch 16: 0.009 at 800; one head of 64:
0.022 at 600; width 128 (0.43 s a step): 0.017 at 600; init_std 0.1: 0.015 at 400; train mixtures
of (2, 4, 8, 16) pairs: 0.019 at 800 and of (24, 32) pairs: 0.008 at 500; zero filler instead of
random tokens between queries: 0.008 at 400; d=32 lr 1e-2 with a (4, 8, 16, 16) mixture: 0.014 at
800; nearly additive writes at initialisation (beta = sigmoid(b_proj x - 2), about 0.12, patched;
1000-step cosine, warmup 50): 0.010 at 600 with lr 3e-3, 0.012 with lr 1e-2. Gated DeltaNet (d=64,
lr 1e-2): 0.010 at 600. The 3:1 hybrid (d=64, lr 1e-2): 0.007 at 400. The earlier note that DeltaNet
d=64 left the plateau by step 750 (3000-step cosine, lr 3e-3) did not reproduce with the current
code (0.008 at 1500), nor with the code of that time (commit a2bce5c, the same probe with warmup 20:
0.012 at step 600); the plateau's end is sensitive to every detail of the run. Not a gradient
bug: the chunked and recurrent forms of the whole model give the same gradients to 1e-15 in
float64 (deltanet, gated_deltanet, kda, linear).

Why softmax leaves the plateau first (our reading, a hypothesis the probes are consistent with, not
a proof): its attention weights are positive, so at initialisation a query already reads the
average of the context's values, and the gradient toward "the answer is one of the values in the
context" (loss ln 16) is there from step 0; the recall circuit then grows from it. A delta-rule
read ``S^T q`` weighs the stored values by ``q . k`` of either sign (L2-normalised SiLU features of
near-zero pre-activations), so that average is not there to bootstrap from, and making the weights
positive does not restore it: with elu+1 features on DeltaNet's q and k (patched, d=64, lr 3e-3) it
stayed at 0.010 at step 500, since with near-parallel keys each delta write replaces the previous
value. Zoology's recipe is much bigger than ours: batch 256, 32 epochs of 180,000 sequences
(~22,000 steps, ~5.8 M sequences, ~360x this preset's 16,000), a 4-point lr sweep, and 2-layer
models without MLPs whose DeltaNet has no output gate, with a convolution block (short and implicit
long convolution) in front of each mixer. One ablation in that direction (the MLPs dropped and
DeltaNet's output gate removed, by patching, not in the code): DeltaNet d=64 at lr 3e-3 then does
move, 0.028, 0.048, 0.057, 0.063, 0.067 at steps 300, 500, 700, 900, 1200 (loss 4.72 to 3.89), i.e.
toward the ~1/16 "one of the context's values" stage rather than recall; either change alone left
it at chance (0.014, 0.011 at step 500). Reproducing the delta family's >= 0.99 on this task needs
more than the 1,500 steps of 32 tried here (Zoology: ~22,000 of 256): hours of CPU per model, or a
GPU (the ``zoology`` preset), not another setting of the 15-minute preset.

The preset's run (2026-11-30, ``linattn mqar --preset cpu``, 2 workers, 195% CPU): 12.7 minutes
wall. Held-out accuracy at d_model 32 / 64: softmax 0.220 / 0.991 (stopped at step 400), linear
(elu+1) 0.028 / 0.047, taylor 0.024 / 0.012, scalar_decay 0.008 / 0.008, deltanet 0.008 / 0.018,
gated_deltanet 0.008 / 0.015, kda 0.010 / 0.007, hybrid 0.008 / 0.009. What it shows: softmax
attention recalls (0.991 at d=64) and its accuracy rises with its state (the KV cache: 8,480 ->
16,960 numbers per layer); elu+1 linear attention is at 0.047 at 2,688 numbers per layer. What it
does not show: the delta family's >= 0.99 (all at chance after 500 steps), for the reasons above.
Softmax's escape depends on the seed and the schedule: with ``--seed 1`` it reached only 0.042 /
0.097 at steps 400 / 500 (d=64; d=32 0.021), while with ``--seed 1 --steps 700`` (a longer cosine)
d=64 reached 0.993 at step 400 (d=32 0.024 at 700). 700 steps would make the whole sweep ~1.4x
longer (an estimated ~18 minutes on 2 idle cores; not run).

Gated DeltaNet stayed at chance (0.011 after 3000 steps at lr 3e-3). Not a bug found: the op
matches the recurrence ``S <- exp(g) S`` then the delta rule to 1e-16, and the gate's formula and
initialisation are those of the reference implementations (fla's and Zoology's Gated DeltaNet:
``g = -exp(A_log) softplus(a_proj x + dt_bias)``, ``A ~ U(0, 16)``, dt log-uniform in [0.001,
0.1]). At initialisation that decay is fast: over 200 draws the per-token alpha = exp(g) has mean
0.855, median 0.932, and half the heads keep < 1% of a token 64 tokens later (KDA's per-channel
gate, same initialisation: mean 0.857, median 0.932). Yet it is not what holds Gated DeltaNet
back: at T=64, 8 pairs, lr 3e-3 both the default and a slow-decay initialisation (A = 1,
dt = 0.001: alpha ~ 0.999) stay at chance to step 700 (0.012, 0.014; DeltaNet 0.019), while at
lr 1e-2 the default one leaves the plateau with seed 0 (0.122, 0.44, 0.68 at steps 500-700;
DeltaNet 0.016) but not with seed 1 (0.008 at step 700), and not at T=128, 16 pairs (0.008 at 600);
the slow-decay initialisation at lr 1e-2 gives 0.011 (seed 0) and 0.041 (seed 1) at step 700.
On this evidence leaving the MQAR plateau depends on the seed, the steps and the learning rate
(Zoology sweeps lr over 1e-3 to 3e-2); the gate's initialisation is not shown to be the obstacle.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from linattn.experiments.mqar.data import MQARTask
from linattn.experiments.mqar.train import TrainConfig, train

MECHANISMS: dict[str, tuple[str, ...]] = {
    "softmax": ("softmax", "softmax"),
    "linear": ("linear", "linear"),
    "taylor": ("taylor", "taylor"),
    "scalar_decay": ("scalar_decay", "scalar_decay"),
    "deltanet": ("deltanet", "deltanet"),
    "gated_deltanet": ("gated_deltanet", "gated_deltanet"),
    "kda": ("kda", "kda"),
    "hybrid": ("kda", "kda", "kda", "softmax"),
}


# Zoology puts a convolution in front of every sequence mixer, attention included
# (HazyResearch/zoology, experiments/models_repo.py: each mixer is ``Hybrid([BaseConv, mixer])``,
# BaseConv a gated convolution of kernel 3). We do not copy BaseConv; we give the softmax blocks
# the short convolution + SiLU on q, k, v that our recurrent mixers already have
# (``LMConfig.short_conv``), so that every mechanism has the same local mixing in front (without
# it, 2-layer softmax models sit at ~1/n_kv on MQAR: see the calibration notes above).
SHORT_CONV_EVERYWHERE = {"softmax_short_conv": True}


@dataclass(frozen=True)
class Preset:
    """A sweep: one task, one training recipe, the mechanisms and widths to cross, lrs to try."""

    name: str
    description: str
    task: MQARTask
    train: TrainConfig
    widths: tuple[int, ...]
    mechanisms: tuple[str, ...] = tuple(MECHANISMS)
    lrs: tuple[float, ...] = (1e-3,)
    n_heads: int = 2
    model_options: dict = field(default_factory=lambda: dict(SHORT_CONV_EVERYWHERE))
    # mechanism -> its own lrs, replacing ``lrs`` for that mechanism (a per-mechanism choice
    # standing in for the lr sweep a bigger budget would run for every mechanism).
    mechanism_lrs: dict[str, tuple[float, ...]] = field(default_factory=dict)
    workers: int = 1

    def __post_init__(self) -> None:
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"unknown mechanism(s) {unknown}; choose from {list(MECHANISMS)}")
        if not self.mechanisms or not self.widths or not self.lrs:
            raise ValueError("a preset needs at least one mechanism, one width and one lr")
        for width in self.widths:
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise ValueError(f"widths must be ints >= 1, got {width!r}")
            if width % self.n_heads:
                raise ValueError(f"width {width} is not divisible by n_heads={self.n_heads}")
        unknown = [m for m in self.mechanism_lrs if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"mechanism_lrs names unknown mechanism(s) {unknown}")
        for lrs in (self.lrs, *self.mechanism_lrs.values()):
            if not lrs:
                raise ValueError("a preset needs at least one mechanism, one width and one lr")
            for lr in lrs:
                if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
                    raise ValueError(f"lrs must be finite numbers > 0, got {lr!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")

    def lrs_for(self, mechanism: str) -> tuple[float, ...]:
        """The learning rates tried for ``mechanism``: its own, or the preset's ``lrs``."""
        return tuple(self.mechanism_lrs.get(mechanism, self.lrs))


PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        name="smoke",
        description="seconds; checks that every mechanism trains end to end (used by the tests)",
        task=MQARTask(vocab_size=32, seq_len=16, n_kv=2),
        train=TrainConfig(
            steps=2, batch_size=4, warmup_steps=1, eval_every=2, eval_examples=8, eval_batch_size=8
        ),
        widths=(16,),
    ),
    "cpu": Preset(
        name="cpu",
        description=(
            "T=128, 16 key-value pairs, widths 32 and 64, 500 steps of 32 (softmax lr 1e-2, the "
            "others 3e-3), 2 worker processes: about 15 minutes on 2 idle CPU cores"
        ),
        task=MQARTask(vocab_size=256, seq_len=128, n_kv=16),
        train=TrainConfig(
            steps=500,
            batch_size=32,
            lr=3e-3,
            warmup_steps=50,
            eval_every=100,
            eval_examples=256,
            stop_accuracy=0.99,
            checkpoint_every=50,
        ),  # fmt: skip
        widths=(32, 64),
        lrs=(3e-3,),
        # softmax attention leaves the plateau by step 300 at 1e-2 and not by 600 at 3e-3; no
        # recurrent mechanism left it by step 500 at either (calibration notes above)
        mechanism_lrs={"softmax": (1e-2,)},
        workers=2,
        # chunk 32: the fastest block length of the chunked forms at T=128
        model_options={"chunk_size": 32, **SHORT_CONV_EVERYWHERE},
    ),
    "zoology": Preset(
        name="zoology",
        description=(
            "paper scale (Arora et al. 2023, Figure 2's hardest setting): V=8192, T=512, 64 pairs, "
            "widths 64-512, 4 learning rates, trained on a mixture of 4-64 pairs; for a GPU budget"
        ),
        task=MQARTask(vocab_size=8192, seq_len=512, n_kv=64),
        train=TrainConfig(
            steps=25_000,
            batch_size=64,
            warmup_steps=1000,
            eval_every=1000,
            eval_examples=3000,
            train_n_kv=(4, 8, 16, 32, 64, 64, 64, 64),
            checkpoint_every=500,
        ),  # fmt: skip
        widths=(64, 128, 256, 512),
        lrs=(1e-4, 4.6e-4, 2.2e-3, 1e-2),
    ),
}

# (mechanism, d_model, preset) -> model mapping ids [B, T] to logits [B, T, vocab]
Builder = Callable[[str, int, Preset], nn.Module]
# (model, seq_len) -> numbers of state per block after seq_len tokens
StateMeter = Callable[[nn.Module, int], list[int]]


def build_model(mechanism: str, d_model: int, preset: Preset) -> nn.Module:
    """The ``linattn.models.CausalLM`` for one mechanism at one width."""
    from linattn.models import CausalLM, LMConfig

    config = LMConfig(
        vocab_size=preset.task.vocab_size,
        d_model=d_model,
        n_heads=preset.n_heads,
        mixers=MECHANISMS[mechanism],
        max_seq_len=preset.task.seq_len,
        **preset.model_options,
    )
    return CausalLM(config)


@torch.no_grad()
def measure_state(model: nn.Module, seq_len: int) -> list[int]:
    """Numbers of state per block after a sequence of ``seq_len`` tokens (cache accounting)."""
    cache = model.new_cache(1)
    was_training = model.training
    model.eval()
    model(torch.zeros(1, seq_len, dtype=torch.long), cache=cache)
    model.train(was_training)
    return [int(n) for n in cache.numbers_per_block()]


def config_hash(preset: Preset, mechanism: str, d_model: int) -> str:
    """A short hash of everything that determines one (mechanism, width) result."""
    blob = json.dumps(
        {
            "task": preset.task.to_dict(),
            "train": {k: v for k, v in preset.train.to_dict().items() if k != "checkpoint_every"},
            "lrs": list(preset.lrs_for(mechanism)),
            "mixers": list(MECHANISMS[mechanism]),
            "d_model": d_model,
            "n_heads": preset.n_heads,
            "model_options": preset.model_options,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_results(path: Path) -> list[dict]:
    """All rows of a results file (missing file: none)."""
    if not path.exists():
        return []
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def run_pair(
    preset: Preset,
    mechanism: str,
    d_model: int,
    *,
    checkpoint_dir: Path | None,
    progress: bool = True,
    builder: Builder = build_model,
    meter: StateMeter = measure_state,
) -> dict:
    """Train one (mechanism, width) at every lr of the preset; the result row (best lr)."""
    sweep = []
    for lr in preset.lrs_for(mechanism):
        torch.manual_seed(preset.train.seed)  # the same initialisation for every lr
        model = builder(mechanism, d_model, preset)
        config = replace(preset.train, lr=lr)
        path = None
        if checkpoint_dir is not None:
            key = config_hash(preset, mechanism, d_model)
            path = checkpoint_dir / f"{preset.name}-{mechanism}-d{d_model}-{key}-lr{lr:g}.pt"
        desc = f"{mechanism} d={d_model} lr={lr:g}"
        result = train(model, preset.task, config, checkpoint=path, progress=progress, desc=desc)
        sweep.append((lr, result, model))
    lr, best, model = max(sweep, key=lambda item: (item[1].accuracy, -item[1].eval_loss))
    per_block = meter(model, preset.task.seq_len)
    return {
        "preset": preset.name,
        "mechanism": mechanism,
        "mixers": list(MECHANISMS[mechanism]),
        "n_layers": len(MECHANISMS[mechanism]),
        "d_model": d_model,
        "n_heads": preset.n_heads,
        "params": sum(p.numel() for p in model.parameters()),
        "state_numbers": sum(per_block) / len(per_block),
        "state_numbers_per_block": per_block,
        **{k: v for k, v in preset.task.to_dict().items() if k != "random_non_queries"},
        "steps": best.steps,
        "max_steps": preset.train.steps,
        "batch_size": preset.train.batch_size,
        "lr": lr,
        "lr_sweep": [
            {
                "lr": x,
                "accuracy": r.accuracy,
                "best_accuracy": r.best_accuracy,
                "steps": r.steps,
                "seconds": round(r.seconds, 2),
            }
            for x, r, _ in sweep
        ],  # fmt: skip
        "accuracy": best.accuracy,
        "best_accuracy": best.best_accuracy,
        "eval_loss": best.eval_loss,
        "stopped_early": best.stopped_early,
        "evals": best.evals,
        "seconds": round(sum(r.seconds for _, r, _ in sweep), 2),
        "seed": preset.train.seed,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config_hash": config_hash(preset, mechanism, d_model),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_sweep(
    preset: Preset,
    *,
    results_path: str | Path,
    checkpoint_dir: str | Path | None = None,
    fresh: bool = False,
    progress: bool = True,
    builder: Builder = build_model,
    meter: StateMeter = measure_state,
    log: Callable[[str], None] = print,
    workers: int | None = None,
    threads_per_worker: int = 1,
) -> list[dict]:
    """Run every (mechanism, width) of ``preset``; append each finished row to ``results_path``.

    Returns the rows of this sweep (reused ones included), in mechanism then width order. With
    ``fresh=True`` earlier rows and checkpoints of this preset are ignored (checkpoints deleted).

    ``workers`` (default ``preset.workers``): with more than one, the pairs run in that many
    processes (spawned; ``builder`` and ``meter`` must be importable functions), each with
    ``threads_per_worker`` torch threads, the most expensive pairs first. Every pair's numbers
    are a function of its own configuration and thread count alone (its seed, its batches, its
    checkpoint), so they do not depend on how the pairs are spread over processes; rows are
    appended as they finish, and the returned list is in the usual order.
    """
    results_path = Path(results_path)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    workers = preset.workers if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    done = {} if fresh else {r.get("config_hash"): r for r in read_results(results_path)}
    rows: dict[tuple[str, int], dict] = {}
    todo = []
    for mechanism in preset.mechanisms:
        for d_model in preset.widths:
            key = config_hash(preset, mechanism, d_model)
            if key in done:
                log(f"{mechanism} d={d_model}: already in {results_path}, reused")
                rows[mechanism, d_model] = done[key]
                continue
            if fresh and ckpt is not None:
                for old in ckpt.glob(f"{preset.name}-{mechanism}-d{d_model}-{key}-lr*.pt"):
                    old.unlink()
            todo.append((mechanism, d_model))

    def record(row: dict) -> None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        with results_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        log(
            f"{row['mechanism']} d={row['d_model']}: accuracy {row['accuracy']:.3f}, state "
            f"{row['state_numbers']:.0f}/layer, {row['steps']} steps, {row['seconds']:.0f} s"
        )
        rows[row["mechanism"], row["d_model"]] = row

    kwargs = dict(checkpoint_dir=ckpt, builder=builder, meter=meter)
    if workers == 1 or len(todo) <= 1:
        for mechanism, d_model in todo:
            record(run_pair(preset, mechanism, d_model, progress=progress, **kwargs))
    else:
        # Longest first (blocks x width as the cost guess), so that no long pair starts last.
        todo.sort(key=lambda pair: -len(MECHANISMS[pair[0]]) * pair[1])
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
            futures = [
                pool.submit(_run_pair_in_worker, threads_per_worker, preset, m, d, kwargs)
                for m, d in todo
            ]
            try:
                for future in as_completed(futures):
                    record(future.result())
            except BaseException:
                for future in futures:  # finished rows are saved; the rest resume next time
                    future.cancel()
                raise
    return [rows[m, d] for m in preset.mechanisms for d in preset.widths]


def _run_pair_in_worker(threads: int, preset: Preset, mechanism: str, d_model: int,
                        kwargs: dict) -> dict:  # fmt: skip
    """``run_pair`` in a worker process, with ``threads`` torch threads and no progress bar."""
    torch.set_num_threads(threads)
    return run_pair(preset, mechanism, d_model, progress=False, **kwargs)


def results_table(rows: Sequence[dict]) -> str:
    """Markdown table: mechanism, width, state per layer, parameters, accuracy, steps, time."""
    lines = [
        "| mechanism | d_model | state / layer | params | accuracy | steps | lr | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['d_model']} | {r['state_numbers']:,.0f} | {r['params']:,} "
            f"| {r['accuracy']:.3f} | {r['steps']} | {r['lr']:g} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def plot_results(rows: Sequence[dict], path: str | Path, title: str = "MQAR") -> Path:
    """PNG of accuracy against state numbers per layer (log scale), one curve per mechanism."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mechanism in dict.fromkeys(r["mechanism"] for r in rows):
        points = sorted(
            (r["state_numbers"], r["accuracy"]) for r in rows if r["mechanism"] == mechanism
        )
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=mechanism)
    ax.set_xscale("log")
    ax.set_xlabel("state size per layer (numbers)")
    ax.set_ylabel("held-out query accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
