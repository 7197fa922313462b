"""MQAR sweep: every mechanism at several widths, seeds and fillers; accuracy against state size.

Mechanisms (``MECHANISMS``; the mixer of each block of ``linattn.models.CausalLM``):

=========================  ==========================================  =======================
name                       blocks                                      spec
=========================  ==========================================  =======================
softmax                    conv, softmax                               2 (state: the KV cache)
linear                     conv, linear (elu + 1 features)             4, 5
taylor                     conv, taylor (Based, 2nd-order Taylor)      4
scalar_decay               conv, scalar_decay (RetNet, Mamba-2 decay)  10
deltanet                   conv, deltanet                              7, 8
gated_deltanet             conv, gated_deltanet                        10
kda                        conv, kda (Kimi Delta Attention)            10
mamba2                     conv, mamba2 (the Mamba-2 mixer, N = 64)    10
hybrid                     conv, softmax, kda, kda, kda                10 (3:1 hybrid)
log_linear_gated_deltanet  conv, log-linear Gated DeltaNet             10 (Fenwick levels)
mesa                       conv, MesaNet (a CG solve per token)        7.3
path                       conv, PaTH attention                        2 (state: carried keys)
forgetting                 conv, FoX (forgetting attention)            2 (state: the KV cache)
=========================  ==========================================  =======================

The model is Zoology's MQAR model (Arora et al. 2023; HazyResearch/zoology's models_repo): a gated
short convolution block (``"conv"``: ``linattn.layers.GatedConvolution``, the paper's BaseConv,
which keeps only its last 2 inputs) and then the mechanism's block; blocks of the mixer alone (no
MLP; ``LMConfig(mlp=False)``) and recurrent mixers without output gate (``output_gate=False``), as
Zoology's DeltaNet and Gated DeltaNet run. The hybrid keeps the convolution block in front and then
three KDA blocks per softmax block, so it is deeper (and has more parameters) at the same width;
the table lists parameters so that this is visible.

State size (``state_numbers``): the numbers a block keeps between tokens at the end of a sequence
of ``seq_len`` tokens, from the model's cache accounting (``cache.numbers_per_block()`` after
running the sequence through ``model.new_cache``): ``H d_k d_v`` (plus normaliser and
short-convolution state) for the recurrent mechanisms, ``2 T H d_head`` for softmax attention's
KV cache. Reported per layer of the mechanism: the mean over its blocks, the ``"conv"`` block in
front not counted (its 2 d_model numbers are in ``state_numbers_per_block``); for the hybrid,
``(3 kda + 1 KV cache) / 4``.

Cells (``cells``): every filler (``Preset.fillers``), mechanism, width and seed (``Preset.seeds``)
is one run of its own, with its own data and initialisation (the seed) and its own lr sweep
(``Preset.lrs``: the same values for every mechanism unless ``mechanism_lrs`` says otherwise). The
sweep keeps the best lr of each seed (the highest final held-out accuracy), as Zoology does; with
``stop_accuracy`` the lrs after one that reached it are skipped. The budget is ``train.steps``
for every mechanism (``mechanism_steps`` is empty in the ``cpu`` preset) and the stopping rule,
``stop_accuracy``, is the same for all. ``summary.summarize`` reduces the seeds of a cell to
their mean, min, max, standard error and the number that solved the task (accuracy >= 0.9).

Results (``results_path``, JSON lines, one object per (fillers, mechanism, width, seed), appended
when it finishes): ``preset, mechanism, mixers, n_layers, d_model, n_heads, params, state_numbers
(per layer of the mechanism), state_numbers_per_block, vocab_size, seq_len, n_kv, power_a,
random_non_queries (the fillers), steps (taken), max_steps, batch_size, lr (the best of the
sweep), lr_sweep [{lr, accuracy, best_accuracy, steps, seconds} or {lr, skipped: true}], accuracy
(final held-out accuracy at that lr), best_accuracy, eval_loss, stopped_early, evals [{step,
accuracy, loss}], seconds (training wall time summed over the lr sweep, resumed pieces included),
cpu_seconds (the CPU time of the whole sweep in the process that ran it, this run's part only),
seed, threads, torch, config_hash, finished (UTC ISO time)``. Files written before seeds and
fillers were cells (one row per mechanism and width) have the same fields and read the same: each
row is one seed's run. A rerun of the same sweep skips cells whose ``config_hash`` is already in
the file and resumes an interrupted cell from its checkpoint.

Why this model and these fillers. The first models (two mechanism blocks, each followed by a SwiGLU
MLP, recurrent mixers with their output gates, random fillers) left every recurrent mechanism on
the MQAR plateau: DeltaNet stayed at chance across learning rates, batch sizes, heads, widths,
initialisation scales, pair-count mixtures and blank fillers, while softmax attention recalled.
The gradients were not at fault (the chunked and recurrent forms of the whole model give the same
gradients to rounding in float64). Rebuilding Zoology's model, part by part, is what let DeltaNet
recall: the conv block in front, no MLP and no output gate each mattered (with the MLPs, DeltaNet
was back at chance).

The fillers: with random tokens from the whole vocabulary between the queries (Zoology's
``random_non_queries``), some queries find their key repeated in the filler before them, followed
by a random token (fewer as V grows). A memory that overwrites a key's value on every new write
(the delta rule) then answers the filler's token, unless the model learns not to write the
filler's repeats. This is a hurdle, not a cap: DeltaNet clears it with some seeds. Zoology's
DeltaNet-era sweeps run ``random_non_queries=False``; the ``cpu`` preset runs both fillers.

Learning rates: softmax attention needs a larger one than the recurrent mechanisms, and recalls
without its own short convolution, so it keeps ``softmax_short_conv`` off; the recurrent
mechanisms do best near 3e-3. Gated DeltaNet and KDA climb more slowly than DeltaNet once they
leave the plateau, and a short schedule can run out under 0.99. Single runs say little here: the
step at which a run leaves the plateau moves with every detail (gate initialisation, the short
convolution, the number of heads, the pair counts, weight decay), so the calibration runs are
evidence, not rankings.

The hybrid puts its softmax block first, right after the conv block (placed last, it recalled
far less); its learning rate decides more than anything else in this sweep, and a sweep
over learning rates per width, Zoology's answer, would multiply the hybrid's share of the budget
(its steps cost several times a two-block model's).

Where the models miss: queries whose pair was written shortly before them are the hard ones, not
distant ones, so the misses are not the decay forgetting; the queries sit densely right after
the context and the convolutions mix neighbours. The Mamba-2 mixer (N = 64, expand 2, head dim
64, two heads) stayed on the plateau with this recipe.

The earlier ``cpu`` preset (T=128, 16 pairs, V=256, widths 32 and 64, one seed, its own lr and
steps per mechanism) gave verdicts that moved with the seed, so the preset became a grid of seeds,
lrs and fillers with one budget for all; to fit that on 2 cores the task was halved at the same
ratios (pairs / T = 1/8, V = 2T) and the widths cut to 64. A cell that solves stops early and
skips its other lrs; one that does not runs 3 lrs x 500 steps.

The gates' initialisation. Gated DeltaNet, which contains DeltaNet, failed where DeltaNet solved.
The cause is the decays' initial step sizes with two heads: Mamba-2's and fla's initialisation
draws each head's A from U(0, 16) and dt log-uniform in [1e-3, 1e-1], an initial decay
exp(-A dt) per token from about 0.99 down to 0.2; a model of 16 or more heads always has slow
heads, a model of two often has none, and then the pairs, written 20 to 60 tokens before their
queries, are forgotten before the model learns to keep them. With dt in [1e-4, 1e-2] the same
runs solved. The preset initialises every data-dependent decay so (``LMConfig.dt_init_range``:
scalar decay, Gated DeltaNet, KDA, Mamba-2 and the hybrid's KDA blocks alike); the layers' own
default stays fla's. FoX's forget gates, whose zero bias (fla's) starts them at 1/2 a token, take
the same range as initial gates exp(-dt): decay times of 100 and 10,000 tokens for its two heads.

``workers=2`` runs two pairs at a time, one thread each, the costliest first (blocks x width x
steps as the guess; per-pair numbers do not depend on the worker count). Chunk 32: at T=128,
chunks of 16, 32 and 64 cost about the same, while one block of 128 and the recurrent form cost
more.

The calibration runs behind these choices, with their numbers, are in
``benchmarks/from-the-code.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from linattn import registry
from linattn.experiments._pool import run_jobs
from linattn.experiments.mqar.data import FILLERS, MQARTask, filler_name
from linattn.experiments.mqar.summary import results_table, summarize  # noqa: F401 (re-exported)
from linattn.experiments.mqar.train import TrainConfig, train
from linattn.results_files import read_results  # noqa: F401 (re-exported)

# Zoology's MQAR model (Arora et al. 2023; HazyResearch/zoology, experiments/models_repo.py):
# two blocks, a gated short convolution ("BaseConv", kernel 3) and then the sequence mixer. We build
# it from our own ``GatedConvolution`` (the ``"conv"`` block of ``LMConfig.mixers``). The hybrid
# keeps the convolution in front, then one softmax block and three KDA blocks (softmax first:
# see the calibration notes above).
_SINGLE = (
    "softmax",
    "linear",
    "taylor",
    "scalar_decay",
    "deltanet",
    "gated_deltanet",
    "kda",
    "mamba2",
)
# the mechanisms beyond a fixed memory of one state, after the hybrid
_BEYOND = ("log_linear_gated_deltanet", "mesa", "path", "forgetting")
CURATED: dict[str, tuple[str, ...]] = {
    **{name: ("conv", name) for name in _SINGLE},
    "hybrid": ("conv", "softmax", "kda", "kda", "kda"),
    **{name: ("conv", name) for name in _BEYOND},
}
# What ``--mechanisms`` may name: the curated list that the presets run, then every other
# mechanism of the registry that has a mixer (a user's too: ``LINATTN_PLUGINS``), in the same
# model (a "conv" block, then the mechanism's).
MECHANISMS: dict[str, tuple[str, ...]] = {
    **CURATED,
    **{m: ("conv", m) for m in registry.mixers() if m not in CURATED},
}

# The blocks of Zoology's MQAR sweeps that train on a CPU budget: no MLP after the mixers (several
# of Zoology's sweeps set ``state_mixer`` to Identity) and no output gate on the recurrent mixers
# (Zoology's DeltaNet and Gated DeltaNet run with ``use_gate=False``). Measured (DeltaNet, d=64,
# T=128, 16 pairs, lr 3e-3, 600 steps of 32, random fillers): 0.588 as built here; 0.198 with the
# output gate; 0.008 (chance) with the MLPs; 0.046 with one DeltaNet block alone (no convolution
# block in front). See the calibration notes above.
ZOOLOGY_BLOCKS = {"mlp": False, "output_gate": False}


def mechanism_blocks(mixers: Sequence[str]) -> list[int]:
    """Indices of the blocks that hold the mechanism's memory (all but the ``"conv"`` blocks)."""
    return [i for i, name in enumerate(mixers) if name != "conv"]


@dataclass(frozen=True)
class Preset:
    """A sweep: one task, one training recipe, the mechanisms and widths to cross, lrs to try."""

    name: str
    description: str
    task: MQARTask
    train: TrainConfig
    widths: tuple[int, ...]
    mechanisms: tuple[str, ...] = tuple(CURATED)
    lrs: tuple[float, ...] = (1e-3,)
    n_heads: int = 2
    model_options: dict = field(default_factory=lambda: dict(ZOOLOGY_BLOCKS))
    # mechanism -> its own lrs, replacing ``lrs`` for that mechanism (a per-mechanism choice
    # standing in for the lr sweep a bigger budget would run for every mechanism).
    mechanism_lrs: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # mechanism -> its own number of training steps (the length of its cosine schedule),
    # replacing ``train.steps`` for that mechanism; ``stop_accuracy`` still ends it early.
    mechanism_steps: dict[str, int] = field(default_factory=dict)
    workers: int = 1
    # every (mechanism, width) is trained once per seed (its data and its initialisation)
    seeds: tuple[int, ...] = (0,)
    # the fillers to run, "blank" and/or "random" (``MQARTask.random_non_queries``); empty: the
    # task's own
    fillers: tuple[str, ...] = ()

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
        for name, table in (("mechanism_lrs", self.mechanism_lrs),
                            ("mechanism_steps", self.mechanism_steps)):  # fmt: skip
            unknown = [m for m in table if m not in MECHANISMS]
            if unknown:
                raise ValueError(f"{name} names unknown mechanism(s) {unknown}")
        for lrs in (self.lrs, *self.mechanism_lrs.values()):
            if not lrs:
                raise ValueError("a preset needs at least one mechanism, one width and one lr")
            for lr in lrs:
                if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
                    raise ValueError(f"lrs must be finite numbers > 0, got {lr!r}")
        for mechanism, steps in self.mechanism_steps.items():
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise ValueError(
                    f"mechanism_steps[{mechanism!r}] must be an int >= 1, got {steps!r}"
                )
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        self._check_seeds_and_fillers()

    def _check_seeds_and_fillers(self) -> None:
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "fillers", tuple(self.fillers))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ValueError(f"seeds must be ints >= 0, got {seed!r}")
        if len(set(self.fillers)) != len(self.fillers) or not set(self.fillers) <= set(FILLERS):
            raise ValueError(f"fillers must be distinct names from {FILLERS}, got {self.fillers}")

    def filler_names(self) -> tuple[str, ...]:
        """The fillers this preset runs: its ``fillers``, or the task's own."""
        return self.fillers or (filler_name(self.task.to_dict()),)

    def cell(self, filler: str, seed: int) -> Preset:
        """This preset narrowed to one filler and one seed: what ``run_pair`` trains (its task and
        training seed set, so that ``config_hash`` and the checkpoints tell the cells apart)."""
        task = replace(self.task, random_non_queries=filler == "random")
        train = replace(self.train, seed=seed)
        return replace(self, task=task, train=train, seeds=(seed,), fillers=(filler,))

    def lrs_for(self, mechanism: str) -> tuple[float, ...]:
        """The learning rates tried for ``mechanism``: its own, or the preset's ``lrs``."""
        return tuple(self.mechanism_lrs.get(mechanism, self.lrs))

    def train_for(self, mechanism: str) -> TrainConfig:
        """The training recipe of ``mechanism``: ``train`` with its own steps, if it has some."""
        if mechanism not in self.mechanism_steps:
            return self.train
        return replace(self.train, steps=self.mechanism_steps[mechanism])


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
            "T=64, 8 key-value pairs, V=128, blank and random fillers, width 64, seeds 0 1 2, "
            "lrs 4.5e-3 1e-2 2e-3 (the best per seed), 500 steps of 32 for every mechanism, "
            "a run stops at 0.99, decays initialised with dt in [1e-4, 1e-2]; 2 worker processes: "
            "about 50 minutes of 2 quiet CPU cores (25.1 measured for the first nine mechanisms; "
            "the cells of log-linear Gated DeltaNet, MesaNet, PaTH and FoX took 2,696 s of CPU)"
        ),
        # the ratios of the earlier T=128 preset (pairs / T = 1/8, V = 2T) at half the length,
        # so that the grid of seeds, lrs and fillers fits on 2 cores (the module docstring)
        task=MQARTask(vocab_size=128, seq_len=64, n_kv=8, random_non_queries=False),
        train=TrainConfig(
            steps=500,
            batch_size=32,
            lr=4.5e-3,
            warmup_steps=50,
            eval_every=100,
            eval_examples=256,
            stop_accuracy=0.99,
            checkpoint_every=50,
        ),  # fmt: skip
        widths=(64,),
        # one grid for every mechanism, tried from its middle (the lrs after one that reaches
        # stop_accuracy are skipped); softmax did best at 1e-2, the recurrent ones at 3e-3 to
        # 4.5e-3 in the earlier preset's calibration
        lrs=(4.5e-3, 1e-2, 2e-3),
        workers=2,
        seeds=(0, 1, 2),
        fillers=("blank", "random"),
        # chunk 32: the fastest block length of the chunked forms at T=128 (two chunks at T=64);
        # the decays' initial step sizes a tenth of fla's, so that two heads still have a slow
        # one (the module docstring)
        model_options={"chunk_size": 32, "dt_init_range": (1e-4, 1e-2), **ZOOLOGY_BLOCKS},
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
            "train": {
                k: v
                for k, v in preset.train_for(mechanism).to_dict().items()
                if k != "checkpoint_every"
            },
            "lrs": list(preset.lrs_for(mechanism)),
            "mixers": list(MECHANISMS[mechanism]),
            "d_model": d_model,
            "n_heads": preset.n_heads,
            "model_options": preset.model_options,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def same_model(row: dict, model: nn.Module) -> bool:
    """Whether a finished row was trained on this model: its parameter count, which the config
    hash cannot see change when a layer's definition does (Gated DeltaNet's values became twice
    as wide as its keys, as the paper's layer, with the same configuration)."""
    return row.get("params") == sum(p.numel() for p in model.parameters())


def append_result(path: Path, row: dict) -> None:
    """Append one finished row to a results file (JSON lines), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


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
    """Train one (mechanism, width) at the lrs of the preset, in order; the row of the best.

    The best is the highest final held-out accuracy (then the lowest loss), as Zoology picks. With
    ``stop_accuracy`` set, the lrs after one that reached it are not trained (any of them could
    only add less than ``1 - stop_accuracy``): they are listed in ``lr_sweep`` as skipped.
    """
    cpu = time.process_time()  # this process's CPU: the worker's own, with workers
    sweep = []
    stop = preset.train_for(mechanism).stop_accuracy
    lrs = preset.lrs_for(mechanism)
    for lr in lrs:
        if stop is not None and any(r.accuracy >= stop for _, r, _ in sweep):
            break
        torch.manual_seed(preset.train.seed)  # the same initialisation for every lr
        model = builder(mechanism, d_model, preset)
        config = replace(preset.train_for(mechanism), lr=lr)
        path = None
        if checkpoint_dir is not None:
            key = config_hash(preset, mechanism, d_model)
            path = checkpoint_dir / f"{preset.name}-{mechanism}-d{d_model}-{key}-lr{lr:g}.pt"
        desc = f"{mechanism} d={d_model} lr={lr:g}"
        result = train(model, preset.task, config, checkpoint=path, progress=progress, desc=desc)
        sweep.append((lr, result, model))
    lr, best, model = max(sweep, key=lambda item: (item[1].accuracy, -item[1].eval_loss))
    per_block = meter(model, preset.task.seq_len)
    memory = [per_block[i] for i in mechanism_blocks(MECHANISMS[mechanism])]
    return {
        "preset": preset.name,
        "mechanism": mechanism,
        "mixers": list(MECHANISMS[mechanism]),
        "n_layers": len(MECHANISMS[mechanism]),
        "d_model": d_model,
        "n_heads": preset.n_heads,
        "params": sum(p.numel() for p in model.parameters()),
        "state_numbers": sum(memory) / len(memory),
        "state_numbers_per_block": per_block,
        **preset.task.to_dict(),
        "steps": best.steps,
        "max_steps": preset.train_for(mechanism).steps,
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
        ]
        + [{"lr": x, "skipped": True} for x in lrs[len(sweep) :]],  # fmt: skip
        "accuracy": best.accuracy,
        "best_accuracy": best.best_accuracy,
        "eval_loss": best.eval_loss,
        "stopped_early": best.stopped_early,
        "evals": best.evals,
        "seconds": round(sum(r.seconds for _, r, _ in sweep), 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "seed": preset.train.seed,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config_hash": config_hash(preset, mechanism, d_model),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# (filler, mechanism, d_model, seed): one row of the results
Cell = tuple[str, str, int, int]


def cells(preset: Preset) -> list[Cell]:
    """Every cell of a preset in table order: filler, then mechanism, width, seed."""
    return [
        (filler, mechanism, d_model, seed)
        for filler in preset.filler_names()
        for mechanism in preset.mechanisms
        for d_model in preset.widths
        for seed in preset.seeds
    ]


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
    """Run every cell of ``preset`` (``cells``: filler, mechanism, width, seed; each its lr sweep,
    ``run_pair``); append each finished row to ``results_path``.

    Returns the rows of this sweep (reused ones included), in ``cells`` order. With ``fresh=True``
    earlier rows and checkpoints of this preset are ignored (checkpoints deleted).

    ``workers`` (default ``preset.workers``): with more than one, the cells run in that many
    processes (spawned; ``builder`` and ``meter`` must be importable functions), each with
    ``threads_per_worker`` torch threads, seed by seed (so that an interrupted sweep has every
    mechanism's first seeds), the most expensive cells first within a seed. Every cell's numbers
    are a function of its own configuration and thread count alone (its seed, its batches, its
    checkpoint), so they do not depend on how the cells are spread over processes; rows are
    appended as they finish, and the returned list is in the usual order.
    """
    results_path = Path(results_path)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    workers = preset.workers if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    rows, todo = _reuse_finished(preset, results_path, ckpt, fresh, builder, log)

    # a finished row's cell, by the hash of its one-seed, one-filler configuration
    by_hash = {config_hash(preset.cell(f, seed), m, d): (f, m, d, seed) for f, m, d, seed in todo}

    def record(row: dict) -> None:
        cell = by_hash[row["config_hash"]]
        append_result(results_path, row)
        log(
            f"{_cell_name(cell)}: accuracy {row['accuracy']:.3f} (lr {row['lr']:g}), state "
            f"{row['state_numbers']:.0f}/layer, {row['steps']} steps, {row['seconds']:.0f} s"
        )
        rows[cell] = row

    kwargs = dict(checkpoint_dir=ckpt, builder=builder, meter=meter)
    if workers > 1:  # one worker: the table's order
        todo.sort(key=lambda cell: _cost_order(preset, cell))
    jobs = [partial(run_pair, preset.cell(f, seed), m, d, **kwargs) for f, m, d, seed in todo]
    run_jobs(jobs, record, workers=workers, threads=threads_per_worker, progress=progress)
    return [rows[cell] for cell in cells(preset)]


def _cost_order(preset: Preset, cell: Cell) -> tuple[int, int]:
    """Seed by seed (an interrupted sweep has every mechanism's first seeds), longest first
    within a seed (blocks x width x steps as the cost guess), so that no long cell starts last."""
    _, mechanism, d_model, seed = cell
    cost = len(MECHANISMS[mechanism]) * d_model * preset.train_for(mechanism).steps
    return preset.seeds.index(seed), -cost


def _cell_name(cell: Cell) -> str:
    filler, mechanism, d_model, seed = cell
    return f"{mechanism} d={d_model} seed {seed} ({filler} fillers)"


def _reuse_finished(
    preset: Preset,
    results_path: Path,
    ckpt: Path | None,
    fresh: bool,
    builder: Builder,
    log: Callable[[str], None],
) -> tuple[dict[Cell, dict], list[Cell]]:
    """The rows already in ``results_path`` for cells of ``preset`` (same ``config_hash`` and
    parameter count), and the cells still to train; stale or ``fresh`` cells lose their
    checkpoints."""
    done = {} if fresh else {r.get("config_hash"): r for r in read_results(results_path)}
    rows: dict[Cell, dict] = {}
    todo = []
    for cell in cells(preset):
        filler, mechanism, d_model, seed = cell
        single = preset.cell(filler, seed)
        key = config_hash(single, mechanism, d_model)
        stale = key in done and not same_model(done[key], builder(mechanism, d_model, single))
        if key in done and not stale:
            log(f"{_cell_name(cell)}: already in {results_path}, reused")
            rows[cell] = done[key]
            continue
        if stale:
            log(
                f"{_cell_name(cell)}: the row in {results_path} was trained on a model of "
                f"{done[key].get('params')} parameters, not today's layer; trained again"
            )
        if (fresh or stale) and ckpt is not None:
            for old in ckpt.glob(f"{preset.name}-{mechanism}-d{d_model}-{key}-lr*.pt"):
                old.unlink()
        todo.append(cell)
    return rows, todo


def plot_results(rows: Sequence[dict], path: str | Path, title: str = "MQAR") -> Path:
    """PNG of accuracy against state numbers per layer (log scale), one curve per mechanism
    (``linattn.figures.plots.mqar_figure``), written to exactly ``path``."""
    from linattn.figures import plots, style

    return style.save_png(plots.mqar_figure(rows, title), path)
