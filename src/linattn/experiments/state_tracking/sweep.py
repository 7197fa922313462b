"""State-tracking sweep: every (task, mechanism, layers, seed) cell trained, then length-tested.

A cell trains a ``linattn.models.CausalLM`` on words of ``train_len`` tokens (a label at every
token, so every prefix length 1 .. train_len is trained on; after a curriculum over lengths, 4, 8,
.. train_len tokens, where the preset has one: ``tasks.StateTask``) with MQAR's ``train``
(AdamW, warmup + cosine, exact-resume checkpoints), then measures the per-token accuracy on fresh
words of each test length. Mechanisms (``MECHANISMS``; LMConfig mixers and options):

    linear            linear attention (elu + 1 features): transitions I, eigenvalue 1
    mamba2_decay      scalar decay per head (``"scalar_decay"``, Mamba-2's): eigenvalues in (0, 1]
    gla               GLA: a decay per channel, eigenvalues in (0, 1]
    deltanet          DeltaNet, beta in [0, 1]: eigenvalues in [0, 1]
    deltanet_neg      DeltaNet, beta in [0, 2] (``allow_neg_eigval``): eigenvalues in [-1, 1]
    gated_deltanet_neg  Gated DeltaNet, beta in [0, 2]
    deltaproduct{2,3,4}_neg  Gated DeltaProduct, n_h writes per token, beta in [0, 2] (present
                      when the ``"deltaproduct"`` mixer is; ``num_householder``)
    rwkv7             RWKV-7, the generalized delta rule (present when the mixer is)
    softmax           softmax attention with RoPE: the reference that does not extrapolate
    log_linear_gated_deltanet_neg  log-linear Gated DeltaNet, beta in [0, 2] (Fenwick levels)
    mesa              MesaNet: the least-squares memory, a CG solve per token
    path              PaTH attention: keys carried through I - beta w w^T, beta in (0, 2)
    forgetting        FoX: softmax attention with a forget gate, no position embedding

The recurrent mixers run without their short convolution (``short_conv=False``). Measured
(parity, DeltaNet beta in [0, 2], d_model 32, 1,000 steps of 32 at lr 1e-2, seed 0): with the
convolution the training accuracy stayed at 0.65 and test accuracy at 512 tokens at 0.52; without
it, 1.000 from step 100 and 0.78 at 512 tokens. The convolution mixes each token's key with its
neighbours', so that no fixed key reflects on every 1 (the construction of ``linattn verify``).

Results (JSON lines, one object per cell, appended when it finishes): ``preset, task, order,
mechanism, mixers, n_layers, model_options, seed, d_model, n_heads, params, train_len,
curriculum_every, steps, lr, batch_size, train_accuracy (held-out, at train_len), evals, accuracy
{length: per-token accuracy}, test_examples, seconds (training wall time), eval_seconds,
cpu_seconds (training and tests, this run's piece of them when resumed), threads, torch,
config_hash, finished``. A rerun
skips cells whose ``config_hash`` is in the file and resumes an interrupted cell from its
checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from linattn import registry
from linattn.experiments._pool import run_jobs
from linattn.experiments.mqar.sweep import append_result
from linattn.experiments.mqar.train import TrainConfig, evaluate, train
from linattn.experiments.state_tracking.tasks import GROUPS, StateTask
from linattn.models.config import MIXERS
from linattn.results_files import read_results

NEG = {"allow_neg_eigval": True}
MECHANISMS: dict[str, tuple[tuple[str, ...], dict]] = {
    "linear": (("linear",), {}),
    "mamba2_decay": (("scalar_decay",), {}),
    "gla": (("gla",), {}),
    "deltanet": (("deltanet",), {}),
    "deltanet_neg": (("deltanet",), NEG),
    "gated_deltanet_neg": (("gated_deltanet",), NEG),
    **{
        f"deltaproduct{n}_neg": (("deltaproduct",), {**NEG, "num_householder": n})
        for n in (2, 3, 4)
        if "deltaproduct" in MIXERS
    },
    # RWKV-7: the generalized delta rule, Diag(w_t) - kappa_t (kappa_t * a_t)^T
    **({"rwkv7": (("rwkv7",), {})} if "rwkv7" in MIXERS else {}),
    "softmax": (("softmax",), {}),
    # beyond a fixed memory of one state: PaTH's beta is in (0, 2) by definition
    "log_linear_gated_deltanet_neg": (("log_linear_gated_deltanet",), NEG),
    "mesa": (("mesa",), {}),
    "path": (("path",), {}),
    "forgetting": (("forgetting",), {}),
}
# what the presets may run: the list above (the registry's other mixers are added below)
CURATED = tuple(MECHANISMS)
LABELS = {
    "linear": "linear attention",
    "mamba2_decay": "Mamba-2 decay",
    "gla": "GLA",
    "deltanet": "DeltaNet [0, 1]",
    "deltanet_neg": "DeltaNet [0, 2]",
    "gated_deltanet_neg": "Gated DeltaNet [0, 2]",
    **{f"deltaproduct{n}_neg": f"DeltaProduct n_h={n} [0, 2]" for n in (2, 3, 4)},
    "rwkv7": "RWKV-7",
    "softmax": "softmax (RoPE)",
    "log_linear_gated_deltanet_neg": "log-linear Gated DeltaNet [0, 2]",
    "mesa": "MesaNet",
    "path": "PaTH",
    "forgetting": "FoX",
}
# Every other mechanism of the registry with a mixer (a user's too: ``LINATTN_PLUGINS``) may be
# named as well, with its own options; the presets run the ones above.
for _mixer in registry.mixers():
    if _mixer not in MECHANISMS:
        MECHANISMS[_mixer] = ((_mixer,), {})
        LABELS[_mixer] = registry.with_mixer(_mixer).title
BASE_OPTIONS = {"short_conv": False, "max_seq_len": None, "chunk_size": 32}


@dataclass(frozen=True)
class Preset:
    """Tasks x mechanisms x layer counts x seeds, one training recipe, the test lengths."""

    name: str
    description: str
    tasks: tuple[str, ...]
    mechanisms: tuple[str, ...]
    train: TrainConfig
    layers: tuple[int, ...] = (1,)
    # mechanisms also trained at these extra layer counts (two layers for a few, in ``default``)
    extra_layers: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # tasks that run only these mechanisms (of ``mechanisms`` and ``extra_layers``, or others):
    # in ``default`` the larger groups run the delta rules with beta in [0, 2] alone
    task_mechanisms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seeds: tuple[int, ...] = (0, 1, 2)
    train_len: int = 64
    # the training words grow 4, 8, .. train_len tokens, doubling every this many steps (0: none)
    curriculum_every: int = 0
    test_lens: tuple[int, ...] = (64, 128, 256, 512)
    test_examples: int = 128
    d_model: int = 32
    n_heads: int = 2
    workers: int = 1

    def __post_init__(self) -> None:
        listed = [m for names in self.task_mechanisms.values() for m in names]
        for name, known, given in (
            ("tasks", GROUPS, (*self.tasks, *self.task_mechanisms)),
            ("mechanisms", MECHANISMS, (*self.mechanisms, *self.extra_layers, *listed)),
        ):
            unknown = [x for x in given if x not in known]
            if unknown or not given:
                raise ValueError(f"{name}: unknown {unknown} or none; choose from {list(known)}")
        for name in ("train_len", "test_examples", "d_model", "n_heads", "workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("layers", "seeds", "test_lens"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                raise ValueError(f"{name} must be a non-empty tuple of ints, got {values!r}")
        StateTask(self.tasks[0], self.train_len, self.curriculum_every)  # checks the curriculum
        if min(self.layers) < 1 or min(self.test_lens) < 1 or min(self.seeds) < 0:
            raise ValueError("layers and test_lens must be >= 1, seeds >= 0")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    def cells(self) -> list[tuple[str, str, int, int]]:
        """Every (task, mechanism, n_layers, seed) of the preset, in table order."""
        return [
            (task, mechanism, n_layers, seed)
            for task in self.tasks
            for mechanism in self.mechanisms_for(task)
            for n_layers in self.layers_for(mechanism)
            for seed in self.seeds
        ]

    def mechanisms_for(self, task: str) -> tuple[str, ...]:
        """The mechanisms of ``task``: its own list if it has one, else the preset's."""
        return self.task_mechanisms.get(
            task, tuple(dict.fromkeys((*self.mechanisms, *self.extra_layers)))
        )

    def layers_for(self, mechanism: str) -> tuple[int, ...]:
        """Layer counts of ``mechanism``: the preset's (a mechanism not in ``mechanisms`` and
        without extra layers runs at those too: a task's own list), then its extra ones."""
        extra = self.extra_layers.get(mechanism, ())
        base = self.layers if mechanism in self.mechanisms or not extra else ()
        return tuple(dict.fromkeys((*base, *extra)))


_TRAIN = dict(warmup_steps=20, eval_every=100, eval_examples=128, eval_batch_size=128)
PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        name="smoke",
        description="seconds: two tasks, three mechanisms, 2 steps (the tests run it)",
        tasks=("parity", "S3"),
        mechanisms=("deltanet", "deltanet_neg", "softmax"),
        train=TrainConfig(steps=2, batch_size=4, lr=1e-2, **{**_TRAIN, "warmup_steps": 1}),
        seeds=(0,),
        train_len=8,
        test_lens=(8, 16),
        test_examples=4,
        d_model=8,
    ),
    "default": Preset(
        name="default",
        description=(
            "parity, mod3, S3 on one layer of every mechanism but DeltaProduct n_h = 4, two of "
            "DeltaNet [0, 2]; A5 on DeltaNet [0, 2] (one and two layers) and DeltaProduct n_h = "
            "2, 3, 4; 3 seeds, d_model 32, 1,000 steps of 32 at lr 1e-2, trained at 64 tokens "
            "after a curriculum (4, 8, .. 64 tokens, doubling every 100 steps), tested at 64-512; "
            "2 workers: 2,214 s of CPU measured (2026-12-03), and 1,556 s for log-linear Gated "
            "DeltaNet, MesaNet, PaTH and FoX (2026-12-07): 31 minutes on 2 free cores"
        ),
        tasks=("parity", "mod3", "S3", "A5"),
        # not DeltaProduct n_h = 4 (4 rows a token) nor RWKV-7 on the small groups: the budget
        mechanisms=tuple(m for m in CURATED if m not in ("deltaproduct4_neg", "rwkv7")),
        extra_layers={"deltanet_neg": (2,)},
        # A5: the mechanisms that can represent it (n_h >= 2) against DeltaNet's one write
        task_mechanisms={
            "A5": ("deltanet_neg", "deltaproduct2_neg", "deltaproduct3_neg", "deltaproduct4_neg")
        },  # fmt: skip
        train=TrainConfig(steps=1000, batch_size=32, lr=1e-2, **_TRAIN),
        curriculum_every=100,
        workers=2,
    ),
    "paper": Preset(
        name="paper",
        description=(
            "the papers' scale (Grazzi et al. 2025, Siems et al. 2025): every task, one and two "
            "layers, d_model 128, 20,000 steps of 256, 5 seeds, tested to 1,024 tokens; for a GPU"
        ),
        tasks=tuple(GROUPS),
        mechanisms=CURATED,
        layers=(1, 2),
        train=TrainConfig(
            steps=20_000,
            batch_size=256,
            lr=1e-3,
            warmup_steps=500,
            eval_every=1000,
            eval_examples=512,
            eval_batch_size=256,
            checkpoint_every=500,
        ),  # fmt: skip
        seeds=(0, 1, 2, 3, 4),
        test_lens=(64, 128, 256, 512, 1024),
        test_examples=512,
        d_model=128,
        n_heads=4,
    ),
}


def build_model(preset: Preset, task: str, mechanism: str, n_layers: int) -> nn.Module:
    """The ``CausalLM`` of one cell: ``n_layers`` blocks of the mechanism's mixer."""
    from linattn.models import CausalLM, LMConfig

    mixers, options = MECHANISMS[mechanism]
    config = LMConfig(
        vocab_size=GROUPS[task].order,
        d_model=preset.d_model,
        n_heads=preset.n_heads,
        mixers=mixers * n_layers,
        **{**BASE_OPTIONS, **options},
    )
    return CausalLM(config)


# The fields of a results row that the sweep, the table and the figure read, with their types.
ROW_FIELDS = {"config_hash": str, "task": str, "mechanism": str, "n_layers": int, "seed": int,
              "accuracy": dict}  # fmt: skip


def check_row(row: dict) -> None:
    """A results row's fields that are read (``ROW_FIELDS``; accuracy: test length -> a number
    in [0, 1]), each of its type, or a ``ValueError`` naming the field: a row edited by hand, or
    another command's, would otherwise fail inside the table or the figure."""
    for name, kind in ROW_FIELDS.items():
        value = row.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(
                f"field {name!r} must be {kind.__name__}, got {type(value).__name__} {value!r}"
            )
    for length, value in row["accuracy"].items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (length.isdigit() and number and 0 <= value <= 1):
            raise ValueError(
                f"field 'accuracy' must map test lengths to accuracies in [0, 1], got "
                f"{length!r}: {value!r}"
            )


def config_hash(preset: Preset, task: str, mechanism: str, n_layers: int, seed: int) -> str:
    """A short hash of everything that determines one cell's numbers."""
    train_settings = replace(preset.train, seed=seed).to_dict()
    train_settings.pop("checkpoint_every")
    blob = json.dumps(
        {
            "task": task,
            "mechanism": list(MECHANISMS[mechanism][0]),
            "options": {**BASE_OPTIONS, **MECHANISMS[mechanism][1]},
            "n_layers": n_layers,
            "train": train_settings,
            "train_len": preset.train_len,
            # only when on, so that the hashes of the rows before the curriculum stay
            **({"curriculum_every": preset.curriculum_every} if preset.curriculum_every else {}),
            "test": [list(preset.test_lens), preset.test_examples],
            "width": [preset.d_model, preset.n_heads],
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_cell(
    preset: Preset,
    task: str,
    mechanism: str,
    n_layers: int,
    seed: int,
    *,
    checkpoint_dir: Path | None,
    progress: bool = True,
) -> dict:
    """Train one cell and test it at every test length; the result row."""
    cpu = time.process_time()  # this process's CPU: the worker's own, with workers
    torch.manual_seed(seed)
    model = build_model(preset, task, mechanism, n_layers)
    config = replace(preset.train, seed=seed)
    state_task = StateTask(task, preset.train_len, preset.curriculum_every)
    key = config_hash(preset, task, mechanism, n_layers, seed)
    path = None
    if checkpoint_dir is not None:
        path = checkpoint_dir / f"{preset.name}-{task}-{mechanism}-L{n_layers}-s{seed}-{key}.pt"
    # The log names the mechanism as --mechanisms takes it and as the table titles it.
    desc = f"{task} {mechanism} ({LABELS.get(mechanism, mechanism)}) x{n_layers} seed {seed}"
    result = train(model, state_task, config, checkpoint=path, progress=progress, desc=desc)
    started = time.perf_counter()
    accuracy = {}
    for length in preset.test_lens:
        inputs, labels = state_task.eval_set(preset.test_examples, seed, length)
        accuracy[str(length)] = evaluate(model, inputs, labels, config.eval_batch_size)[0]
    mixers, options = MECHANISMS[mechanism]
    return {
        "preset": preset.name,
        "task": task,
        "order": GROUPS[task].order,
        "mechanism": mechanism,
        "mixers": list(mixers * n_layers),
        "n_layers": n_layers,
        "model_options": {**BASE_OPTIONS, **options},
        "seed": seed,
        "d_model": preset.d_model,
        "n_heads": preset.n_heads,
        "params": sum(p.numel() for p in model.parameters()),
        "train_len": preset.train_len,
        "curriculum_every": preset.curriculum_every,
        "steps": result.steps,
        "lr": config.lr,
        "batch_size": config.batch_size,
        "train_accuracy": result.accuracy,
        "evals": result.evals,
        "accuracy": accuracy,
        "test_examples": preset.test_examples,
        "seconds": round(result.seconds, 2),
        "eval_seconds": round(time.perf_counter() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config_hash": key,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_sweep(
    preset: Preset,
    *,
    results_path: str | Path,
    checkpoint_dir: str | Path | None = None,
    fresh: bool = False,
    progress: bool = True,
    threads_per_worker: int = 1,
    log=print,
) -> list[dict]:
    """Run every cell of ``preset`` not yet in ``results_path``; append each row as it finishes.

    Returns the preset's rows (reused ones included) in ``preset.cells()`` order. ``fresh=True``
    ignores earlier rows and deletes this preset's checkpoints. The cells run in
    ``preset.workers`` processes (``linattn.experiments._pool``); a cell's numbers depend on its
    own configuration and thread count only.
    """
    results_path = Path(results_path)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    earlier = [] if fresh else read_results(results_path, check=check_row)
    done = {r["config_hash"]: r for r in earlier}
    if fresh and ckpt is not None:
        for old in ckpt.glob(f"{preset.name}-*.pt"):
            old.unlink()
    rows: dict[tuple, dict] = {}
    todo = []
    for cell in preset.cells():
        key = config_hash(preset, *cell)
        if key in done:
            rows[cell] = done[key]
        else:
            todo.append(cell)
    if rows:
        log(f"{len(rows)} of {len(rows) + len(todo)} cells already in {results_path}, reused")

    def record(row: dict) -> None:
        append_result(results_path, row)
        cell = (row["task"], row["mechanism"], row["n_layers"], row["seed"])
        rows[cell] = row
        accuracy = " ".join(f"{v:.2f}" for v in row["accuracy"].values())
        log(
            f"[{len(rows)}/{len(preset.cells())}] {cell[0]} {cell[1]} x{cell[2]} seed {cell[3]}: "
            f"accuracy at {'/'.join(row['accuracy'])}: {accuracy} ({row['seconds']:.0f} s)"
        )

    # Seed by seed: every cell of seed 0 first, so that an interrupted sweep has whole seeds.
    todo.sort(key=lambda cell: (preset.seeds.index(cell[3]), -cell[2]))
    jobs = [partial(run_cell, preset, *cell, checkpoint_dir=ckpt) for cell in todo]
    run_jobs(jobs, record, workers=preset.workers, threads=threads_per_worker, progress=progress)
    return [rows[cell] for cell in preset.cells()]
