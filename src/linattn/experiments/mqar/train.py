"""Training loop for MQAR: AdamW, warmup + cosine schedule, evaluation, exact-resume checkpoints.

Any ``nn.Module`` that maps token ids ``[B, T]`` to logits ``[B, T, vocab]`` can be trained (the
sweep uses ``linattn.models.CausalLM``; the tests a tiny stand-in). The loss is the cross-entropy at
the query positions only (labels -100 elsewhere); accuracy is the fraction of queries whose argmax
prediction is the right value, as in Zoology.

Determinism and exact resume: the batch of step s is a pure function of ``(seed, s)``
(``data.train_batch``), the evaluation set of ``seed``; a checkpoint holds the model, the optimizer,
the torch RNG state, the step and the history. A run resumed from a checkpoint therefore takes the
same steps on the same data from the same state, and ends with the same numbers (bit for bit on the
same machine and thread count) as one that was never interrupted.

Checkpoint file (``torch.save`` of a dict, written atomically): ``format``, ``fingerprint`` (task
and training configuration: a checkpoint of another configuration is refused), ``step``, ``done``,
``model``, ``optimizer``, ``torch_rng``, ``losses``, ``evals``, ``seconds``.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from linattn.experiments.mqar import data
from linattn.experiments.mqar.data import IGNORE_INDEX, MQARTask

CHECKPOINT_FORMAT = 1


class TrainTask(Protocol):
    """What ``train`` needs of a task other than MQAR (the state-tracking word problems)."""

    def train_batch(self, batch_size: int, seed: int, step: int) -> tuple[torch.Tensor, ...]: ...

    def eval_set(self, num_examples: int, seed: int) -> tuple[torch.Tensor, ...]: ...

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``lr`` peaks after ``warmup_steps`` and decays to ``min_lr_ratio*lr``.

    ``stop_accuracy``: stop early once the held-out accuracy reaches it (None: run all ``steps``).
    ``train_n_kv``: key-value counts of the training sequences, equal shares of each batch (Zoology
    trains on such a mixture); None: the task's own count. Evaluation is always at the task's count.
    ``checkpoint_every`` does not change the numbers, so it is left out of the fingerprint.
    """

    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 50
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    eval_every: int = 100
    eval_examples: int = 1000
    eval_batch_size: int = 250
    seed: int = 0
    stop_accuracy: float | None = None
    train_n_kv: tuple[int, ...] | None = None
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_examples", "eval_batch_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_int("checkpoint_every", self.checkpoint_every, 1)
        _check_int("seed", self.seed, 0)
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if self.train_n_kv is not None:
            object.__setattr__(self, "train_n_kv", tuple(self.train_n_kv))
            for n in self.train_n_kv:
                _check_int("train_n_kv", n, 1)
            if not self.train_n_kv or self.batch_size % len(self.train_n_kv):
                raise ValueError(
                    f"train_n_kv must be non-empty and divide batch_size ({self.batch_size}) into "
                    f"equal shares, got {self.train_n_kv}"
                )
        if self.stop_accuracy is not None and not 0.0 < self.stop_accuracy <= 1.0:
            raise ValueError(f"stop_accuracy must be in (0, 1] or None, got {self.stop_accuracy}")

    def to_dict(self) -> dict:
        """The configuration as a plain dict."""
        return asdict(self)


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


@dataclass
class TrainResult:
    """What a run produced: final and best held-out accuracy, histories, time, steps taken."""

    accuracy: float
    best_accuracy: float
    eval_loss: float
    steps: int
    seconds: float
    stopped_early: bool
    complete: bool
    losses: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then half a cosine down to ``min_lr_ratio * lr``.

    ``lr_s = lr (s+1)/W`` for s < W; then ``lr (m + (1-m) (1 + cos(pi (s-W)/(N-W))) / 2)``.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    m = config.min_lr_ratio
    return config.lr * (m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (biases and norm gains are left alone, as usual)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98))


def masked_loss_and_hits(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, int, int]:
    """Cross-entropy over the query positions; also (correct predictions, number of queries).

    ``logits [B, T, V]``, ``labels [B, T]`` with -100 where nothing is asked.
    """
    if logits.ndim != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"model must return logits [B, T, vocab] matching labels {tuple(labels.shape)}, "
            f"got {tuple(logits.shape)}"
        )
    flat = logits.reshape(-1, logits.shape[-1])  # [B*T, V]
    target = labels.reshape(-1)  # [B*T]
    loss = F.cross_entropy(flat.float(), target, ignore_index=IGNORE_INDEX)
    asked = target != IGNORE_INDEX
    hits = int((flat[asked].argmax(-1) == target[asked]).sum())
    return loss, hits, int(asked.sum())


@torch.no_grad()
def evaluate(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """(accuracy, mean loss per query) of ``model`` on a held-out set, in eval mode."""
    was_training = model.training
    model.eval()
    total_loss, hits, asked = 0.0, 0, 0
    for start in range(0, inputs.shape[0], batch_size):
        x, y = inputs[start : start + batch_size], labels[start : start + batch_size]
        loss, h, n = masked_loss_and_hits(model(x), y)
        total_loss += float(loss) * n
        hits, asked = hits + h, asked + n
    model.train(was_training)
    return hits / asked, total_loss / asked


def fingerprint(model: nn.Module, task: MQARTask | TrainTask, config: TrainConfig) -> dict:
    """What must match for a checkpoint to be resumed: task, training settings, model shape."""
    settings = config.to_dict()
    settings.pop("checkpoint_every")
    shapes = {name: list(p.shape) for name, p in model.state_dict().items()}
    return {
        "task": task.to_dict(),
        "train": settings,
        "model": type(model).__name__,
        "shapes": shapes,
    }


def save_checkpoint(path: Path, state: dict) -> None:
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, expected: dict) -> dict:
    """Load a checkpoint and check it belongs to this run; ``ValueError`` if it does not."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
        # A truncated or foreign file (a run killed before the atomic saves, a copy cut short).
        raise ValueError(
            f"checkpoint {path} cannot be read ({' '.join(str(error).split())[:200]}); "
            "delete it or choose another checkpoint path"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), dict):
        raise ValueError(f"checkpoint {path} is not a linattn MQAR checkpoint; delete it")
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} has format {state.get('format')}, expected 1")
    if state["fingerprint"] != expected:
        diff = sorted(k for k in expected if state["fingerprint"].get(k) != expected[k])
        raise ValueError(
            f"checkpoint {path} was written for a different configuration (differs in: "
            f"{', '.join(diff)}); delete it or choose another checkpoint path"
        )
    return state


def _result(state: dict, complete: bool, stopped_early: bool) -> TrainResult:
    evals = state["evals"]
    return TrainResult(
        accuracy=evals[-1]["accuracy"] if evals else float("nan"),
        best_accuracy=max((e["accuracy"] for e in evals), default=float("nan")),
        eval_loss=evals[-1]["loss"] if evals else float("nan"),
        steps=state["step"],
        seconds=state["seconds"],
        stopped_early=stopped_early,
        complete=complete,
        losses=list(state["losses"]),
        evals=list(evals),
    )


def train(
    model: nn.Module,
    task: MQARTask | TrainTask,
    config: TrainConfig,
    *,
    checkpoint: str | os.PathLike | None = None,
    progress: bool = True,
    desc: str = "mqar",
    stop_after: int | None = None,
) -> TrainResult:
    """Train ``model`` on ``task`` (MQAR or a ``TrainTask``); resume from ``checkpoint`` if any.

    Every ``checkpoint_every`` steps and at the end the state is saved to ``checkpoint`` (if
    given); an interrupted run (Ctrl-C, a crash) restarts from the last such save. ``stop_after=k``
    stops after step k as an interruption would, saving a checkpoint: the result then has
    ``complete=False``. Evaluation runs every ``eval_every`` steps and after the last; the reported
    ``accuracy`` is the last evaluation's.
    """
    _check_task(task)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if config.train_n_kv is not None:
        if not isinstance(task, MQARTask):
            raise ValueError(
                "train_n_kv (a mixture of key-value counts) applies to MQAR tasks only"
            )
        data.mix_tasks(task, config.train_n_kv)  # every count must fit the sequence: fail early
    path = Path(checkpoint) if checkpoint is not None else None
    optimizer = make_optimizer(model, config)
    expected = fingerprint(model, task, config)
    state = {"step": 0, "losses": [], "evals": [], "seconds": 0.0, "done": False, "stopped": False}
    if path is not None and path.exists():
        saved = load_checkpoint(path, expected)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        state = {k: saved[k] for k in state}
        if state["done"]:
            return _result(state, complete=True, stopped_early=state["stopped"])
    else:
        torch.manual_seed(config.seed)  # for any randomness inside the model (e.g. dropout)

    def snapshot() -> None:
        if path is not None:
            save_checkpoint(
                path,
                {
                    **state,
                    "format": CHECKPOINT_FORMAT,
                    "fingerprint": expected,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                },
            )

    eval_inputs, eval_labels = _eval_set(task, config)
    bar = _progress_bar(config.steps, state["step"], desc, progress)
    started = time.perf_counter()
    saved_seconds = state["seconds"]
    model.train()
    try:
        while state["step"] < config.steps and not state["done"]:
            step = state["step"]
            loss, hits, asked = _train_step(model, optimizer, task, config, step)
            state["losses"].append(loss)
            state["step"] = step + 1
            evaluate_now = state["step"] % config.eval_every == 0 or state["step"] == config.steps
            if evaluate_now:
                acc, eval_loss = evaluate(model, eval_inputs, eval_labels, config.eval_batch_size)
                state["evals"].append({"step": state["step"], "accuracy": acc, "loss": eval_loss})
                reached = config.stop_accuracy is not None and acc >= config.stop_accuracy
                state["stopped"] = reached and state["step"] < config.steps
                state["done"] = reached or state["step"] == config.steps
            state["seconds"] = saved_seconds + time.perf_counter() - started
            _show(bar, loss, hits / max(asked, 1), state["evals"])
            interrupted = stop_after is not None and state["step"] >= stop_after
            if state["done"] or interrupted or state["step"] % config.checkpoint_every == 0:
                snapshot()
            if interrupted and not state["done"]:
                return _result(state, complete=False, stopped_early=False)
    finally:
        bar.close()
    return _result(state, complete=True, stopped_early=state["stopped"])


def _check_task(task: object) -> None:
    """An ``MQARTask``, or any task with the same three methods (``StateTask`` of
    ``linattn.experiments.state_tracking``): ``train_batch(batch_size, seed, step)``,
    ``eval_set(num_examples, seed)`` (inputs and labels ``[N, T]``) and ``to_dict()``."""
    if isinstance(task, MQARTask):
        return
    if not all(callable(getattr(task, name, None)) for name in _TASK_METHODS):
        raise TypeError(
            f"task must be an MQARTask or have the methods {', '.join(_TASK_METHODS)}, "
            f"got {type(task).__name__}"
        )


_TASK_METHODS = ("train_batch", "eval_set", "to_dict")


def _train_batch(
    task: MQARTask | TrainTask, config: TrainConfig, step: int
) -> tuple[torch.Tensor, ...]:
    """The batch of step ``step``: a pure function of (seed, step), whatever the task."""
    if isinstance(task, MQARTask):
        return data.train_batch(task, config.batch_size, config.seed, step, config.train_n_kv)
    return task.train_batch(config.batch_size, config.seed, step)


def _eval_set(task: MQARTask | TrainTask, config: TrainConfig) -> tuple[torch.Tensor, ...]:
    """The held-out set of ``config.eval_examples`` sequences at the training length."""
    if isinstance(task, MQARTask):
        return data.eval_set(task, config.eval_examples, config.seed)
    return task.eval_set(config.eval_examples, config.seed)


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    task: MQARTask | TrainTask,
    config: TrainConfig,
    step: int,
) -> tuple[float, int, int]:
    inputs, labels = _train_batch(task, config, step)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, config)
    loss, hits, asked = masked_loss_and_hits(model(inputs), labels)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"training loss is {float(loss)} at step {step}; lower the lr")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return float(loss.detach()), hits, asked


def _progress_bar(total: int, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)


def _show(bar, loss: float, accuracy: float, evals: list[dict]) -> None:
    bar.update(1)
    if bar.n % 10 == 0 or evals and evals[-1]["step"] == bar.n:
        postfix = {"loss": f"{loss:.3f}", "acc": f"{accuracy:.3f}"}
        if evals:
            postfix["eval"] = f"{evals[-1]['accuracy']:.3f}"
        bar.set_postfix(postfix, refresh=False)
