"""The MQAR training loop: schedule, evaluation, early stop, and exact resume from checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from linattn.experiments.mqar import data, train
from linattn.experiments.mqar.data import MQARTask
from linattn.experiments.mqar.train import TrainConfig, learning_rate

from .conftest import Oracle, TinyGRU

TASK = MQARTask(vocab_size=32, seq_len=16, n_kv=2)
CONFIG = TrainConfig(
    steps=12, batch_size=8, lr=3e-3, warmup_steps=3, eval_every=4, eval_examples=40,
    eval_batch_size=16, checkpoint_every=5, seed=3,
)  # fmt: skip


def fresh_model(seed: int = 0) -> TinyGRU:
    torch.manual_seed(seed)
    return TinyGRU(TASK.vocab_size)


def test_learning_rate_warmup_then_cosine() -> None:
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [learning_rate(s, config) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3)  # the cosine starts at its peak
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    midpoint = 10 + 45  # half way through the decay: halfway between peak and floor
    assert lrs[midpoint] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert learning_rate(100, config) == pytest.approx(1e-4)
    assert math.isclose(
        learning_rate(99, config), 1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 89 / 90)) / 2
    )


def test_training_runs_and_learns_the_value_half() -> None:
    """The GRU at least learns that answers are values (upper vocabulary half): loss drops."""
    config = TrainConfig(steps=60, batch_size=16, lr=1e-2, warmup_steps=5, eval_every=30,
                         eval_examples=64)  # fmt: skip
    result = train.train(fresh_model(), TASK, config, progress=False)
    assert result.complete and result.steps == 60 and len(result.losses) == 60
    assert [e["step"] for e in result.evals] == [30, 60]
    assert sum(result.losses[-10:]) / 10 < sum(result.losses[:5]) / 5 - 0.5
    assert 0.0 <= result.accuracy <= 1.0 and result.seconds > 0


def test_evaluate_scores_an_oracle_at_one_and_a_constant_at_zero() -> None:
    inputs, labels = data.eval_set(TASK, 50, seed=0)
    acc, loss = train.evaluate(Oracle(TASK.vocab_size, TASK.n_kv), inputs, labels, 16)
    assert acc == 1.0 and loss == pytest.approx(
        math.log1p((TASK.vocab_size - 1) * math.exp(-10)), rel=1e-4
    )
    constant = TinyGRU(TASK.vocab_size)
    for p in constant.parameters():
        torch.nn.init.zeros_(p)  # logits all zero: argmax is token 0, never a value
    acc, loss = train.evaluate(constant, inputs, labels, 16)
    assert acc == 0.0 and loss == pytest.approx(math.log(TASK.vocab_size))


def test_stop_accuracy_stops_at_the_first_evaluation_that_reaches_it(tmp_path) -> None:
    config = TrainConfig(steps=50, batch_size=4, eval_every=5, eval_examples=20, stop_accuracy=0.99)
    path = tmp_path / "oracle.pt"
    result = train.train(Oracle(TASK.vocab_size, TASK.n_kv), TASK, config, checkpoint=path,
                         progress=False)  # fmt: skip
    assert result.stopped_early and result.steps == 5 and result.accuracy == 1.0
    again = train.train(Oracle(TASK.vocab_size, TASK.n_kv), TASK, config, checkpoint=path,
                        progress=False)  # fmt: skip
    assert again.stopped_early and again.steps == 5  # a finished run is not trained again


def assert_same_run(a: train.TrainResult, b: train.TrainResult, model_a, model_b) -> None:
    assert a.losses == b.losses  # exactly, float for float
    assert a.evals == b.evals
    assert a.accuracy == b.accuracy and a.steps == b.steps
    for (name, x), (_, y) in zip(model_a.state_dict().items(), model_b.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(x, y), name


def test_interrupted_run_resumes_exactly(tmp_path) -> None:
    straight_model = fresh_model()
    straight = train.train(straight_model, TASK, CONFIG, progress=False)

    path = tmp_path / "run.pt"
    first = train.train(fresh_model(), TASK, CONFIG, checkpoint=path, stop_after=6, progress=False)
    assert not first.complete and first.steps == 6 and path.exists()
    # A new process would build the model from scratch (another init): the checkpoint restores it.
    resumed_model = fresh_model(seed=99)
    resumed = train.train(resumed_model, TASK, CONFIG, checkpoint=path, progress=False)
    assert resumed.complete
    assert_same_run(straight, resumed, straight_model, resumed_model)


def test_crash_between_checkpoints_resumes_from_the_last_one(tmp_path, monkeypatch) -> None:
    straight_model = fresh_model()
    straight = train.train(straight_model, TASK, CONFIG, progress=False)

    real_batch = data.train_batch

    def crashing_batch(task, batch_size, seed, step, mix=None):
        if step == 7:  # steps 0..6 done, the last checkpoint was written after step 5
            raise RuntimeError("simulated crash")
        return real_batch(task, batch_size, seed, step, mix)

    path = tmp_path / "run.pt"
    monkeypatch.setattr(data, "train_batch", crashing_batch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train.train(fresh_model(), TASK, CONFIG, checkpoint=path, progress=False)
    assert torch.load(path, weights_only=True)["step"] == 5
    monkeypatch.setattr(data, "train_batch", real_batch)
    resumed_model = fresh_model(seed=7)
    resumed = train.train(resumed_model, TASK, CONFIG, checkpoint=path, progress=False)
    assert_same_run(straight, resumed, straight_model, resumed_model)


def test_checkpoint_of_another_configuration_is_refused(tmp_path) -> None:
    path = tmp_path / "run.pt"
    train.train(fresh_model(), TASK, CONFIG, checkpoint=path, stop_after=2, progress=False)
    other = TrainConfig(**{**CONFIG.to_dict(), "lr": 1e-3})
    with pytest.raises(ValueError, match="different configuration.*train"):
        train.train(fresh_model(), TASK, other, checkpoint=path, progress=False)
    # checkpoint_every does not change the numbers, so it may differ
    relaxed = TrainConfig(**{**CONFIG.to_dict(), "checkpoint_every": 2})
    assert train.train(fresh_model(), TASK, relaxed, checkpoint=path, progress=False).complete


@pytest.mark.parametrize("keep", [0, 10, 0.5], ids=["empty", "10-bytes", "half"])
def test_truncated_checkpoint_is_a_clear_error_naming_the_file(tmp_path, keep) -> None:
    path = tmp_path / "run.pt"
    train.train(fresh_model(), TASK, CONFIG, checkpoint=path, stop_after=2, progress=False)
    payload = path.read_bytes()
    path.write_bytes(payload[: int(keep * len(payload)) if isinstance(keep, float) else keep])
    with pytest.raises(ValueError, match=f"checkpoint {path} cannot be read"):
        train.train(fresh_model(), TASK, CONFIG, checkpoint=path, progress=False)


def test_a_foreign_checkpoint_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "run.pt"
    torch.save({"step": 3}, path)  # no fingerprint: not one of ours
    with pytest.raises(ValueError, match="not a linattn MQAR checkpoint"):
        train.train(fresh_model(), TASK, CONFIG, checkpoint=path, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(steps=0), ValueError, "steps must be >= 1"),
        (dict(lr=-1.0), ValueError, "lr must be"),
        (dict(lr=float("inf")), ValueError, "lr must be"),
        (dict(batch_size=2.0), TypeError, "batch_size must be an int"),
        (dict(stop_accuracy=1.5), ValueError, "stop_accuracy"),
        (dict(grad_clip=0.0), ValueError, "grad_clip"),
        (dict(min_lr_ratio=2.0), ValueError, "min_lr_ratio"),
    ],
)
def test_bad_training_configuration(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        TrainConfig(**kwargs)


def test_model_returning_wrong_shape_is_a_clear_error() -> None:
    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.zeros(x.shape[0], TASK.vocab_size) + self.w

    with pytest.raises(ValueError, match=r"logits \[B, T, vocab\]"):
        train.train(Flat(), TASK, CONFIG, progress=False)


def test_training_on_a_mixture_validates_before_training() -> None:
    config = TrainConfig(**{**CONFIG.to_dict(), "train_n_kv": (1, 2)})
    assert config.train_n_kv == (1, 2)
    result = train.train(fresh_model(), TASK, config, progress=False)
    assert result.complete and result.steps == CONFIG.steps
    with pytest.raises(ValueError, match="divide batch_size"):
        TrainConfig(batch_size=8, train_n_kv=(1, 2, 3))
    too_many = TrainConfig(**{**CONFIG.to_dict(), "train_n_kv": (2, 8)})  # 8 > seq_len / 4
    with pytest.raises(ValueError, match="n_kv too large"):
        train.train(fresh_model(), TASK, too_many, progress=False)
