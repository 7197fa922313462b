"""The MQAR generator: vocabulary halves, labels, the power law of the gaps, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from linattn.experiments.mqar import data
from linattn.experiments.mqar.data import IGNORE_INDEX, MQARTask, gap_probabilities, generate


def check_sequences(task: MQARTask, inputs: torch.Tensor, labels: torch.Tensor) -> None:
    """Every invariant of an MQAR sequence, checked row by row with plain Python."""
    n, half = task.n_kv, task.vocab_size // 2
    assert inputs.shape == labels.shape == (inputs.shape[0], task.seq_len)
    for row, lab in zip(inputs.tolist(), labels.tolist(), strict=True):
        keys, values = row[0 : 2 * n : 2], row[1 : 2 * n : 2]
        assert all(1 <= k < half for k in keys), keys
        assert all(half <= v < task.vocab_size for v in values), values
        assert len(set(keys)) == n and len(set(values)) == n
        pairs = dict(zip(keys, values, strict=True))
        assert lab[: 2 * n] == [IGNORE_INDEX] * (2 * n)
        queried = []
        for t in range(2 * n, task.seq_len):
            if lab[t] != IGNORE_INDEX:
                assert (t - 2 * n) % 2 == 0  # queries sit on even offsets after the context
                # the label is the value that followed this key in the context
                assert lab[t] == pairs[row[t]], (t, row[t], lab[t])
                queried.append(row[t])
        assert sorted(queried) == sorted(keys)  # every key asked exactly once


@pytest.mark.parametrize(
    "task",
    [
        MQARTask(vocab_size=20, seq_len=16, n_kv=2, random_non_queries=False),
        MQARTask(vocab_size=64, seq_len=32, n_kv=8),  # n_kv at its maximum seq_len / 4
        MQARTask(vocab_size=8192, seq_len=128, n_kv=16),
        MQARTask(vocab_size=131, seq_len=130, n_kv=5, power_a=1.0),  # odd vocab, uniform gaps
    ],
)
def test_sequences_are_well_formed(task: MQARTask) -> None:
    inputs, labels = generate(task, 200, rng=1)
    check_sequences(task, inputs, labels)
    assert inputs.dtype == labels.dtype == torch.int64


def test_docstring_worked_example_is_what_the_generator_gives() -> None:
    task = MQARTask(vocab_size=20, seq_len=16, n_kv=2, random_non_queries=False)
    inputs, labels = generate(task, 1, rng=0)
    lines = {
        line.split()[0]: [int(x) for x in line.split()[1:]]
        for line in data.__doc__.splitlines()
        if line.strip().startswith(("input ", "label "))
    }
    assert inputs[0].tolist() == lines["input"]
    assert labels[0].tolist() == lines["label"]


def test_filler_is_zero_or_random() -> None:
    plain = MQARTask(vocab_size=100, seq_len=64, n_kv=4, random_non_queries=False)
    inputs, labels = generate(plain, 50, rng=3)
    filler = (labels == IGNORE_INDEX) & (torch.arange(64) >= 8)
    assert bool((inputs[filler] == 0).all())
    noisy = MQARTask(vocab_size=100, seq_len=64, n_kv=4, random_non_queries=True)
    inputs, labels = generate(noisy, 50, rng=3)
    filler_tokens = inputs[(labels == IGNORE_INDEX) & (torch.arange(64) >= 8)]
    assert len(torch.unique(filler_tokens)) > 90  # spread over the whole vocabulary


def test_gap_probabilities_follow_the_power_law() -> None:
    p = gap_probabilities(50, 0.01)
    g = np.arange(1, 51)
    np.testing.assert_allclose(p / p[0], g**-0.99, rtol=1e-12)
    assert p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(gap_probabilities(7, 1.0), np.full(7, 1 / 7))


def test_empirical_gaps_match_the_power_law() -> None:
    """Chi-square test, fixed seed: the slot of the first-drawn key is one draw from p.

    (Later keys are drawn without replacement, so their marginal is not p; the first is.) With 20000
    samples over 24 slots a real deviation (e.g. uniform slots, or g^-0.5) gives p-values < 1e-100.
    """
    task = MQARTask(vocab_size=256, seq_len=64, n_kv=8)
    _, _, slots = generate(task, 20000, rng=123, return_slots=True)
    p = gap_probabilities(task.n_slots, task.power_a)
    observed = np.bincount(slots[:, 0].numpy(), minlength=task.n_slots)
    result = stats.chisquare(observed, f_exp=p * observed.sum())
    assert result.pvalue > 1e-3, result
    # the law favours short gaps: slot 0 about twice as often as slot 1, 24 times slot 23
    assert observed[0] > 1.8 * observed[1]
    # and all n_kv slots are distinct in every row (without replacement)
    assert all(len(set(row)) == task.n_kv for row in slots.tolist())


def test_without_replacement_matches_sequential_draws() -> None:
    """The Gumbel-top-k second draw has the law of a sequential weighted draw without replacement:
    P(second = j) = sum_i p_i p_j / (1 - p_i)."""
    task = MQARTask(vocab_size=64, seq_len=20, n_kv=2)  # 8 slots
    p = gap_probabilities(task.n_slots, task.power_a)
    _, _, slots = generate(task, 40000, rng=7, return_slots=True)
    second = [sum(p[i] * p[j] / (1 - p[i]) for i in range(8) if i != j) for j in range(8)]
    expected = np.array(second)
    observed = np.bincount(slots[:, 1].numpy(), minlength=8)
    assert stats.chisquare(observed, f_exp=expected * observed.sum()).pvalue > 1e-3


def test_same_seed_same_data_other_seed_other_data() -> None:
    task = MQARTask(vocab_size=512, seq_len=128, n_kv=16)
    a = generate(task, 1500, rng=5)  # more than one generation block
    b = generate(task, 1500, rng=np.random.default_rng(5))
    c = generate(task, 1500, rng=6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    # per-step training batches are pure functions of (seed, step); eval set differs from them
    assert torch.equal(data.train_batch(task, 8, 0, 3)[0], data.train_batch(task, 8, 0, 3)[0])
    assert not torch.equal(data.train_batch(task, 8, 0, 3)[0], data.train_batch(task, 8, 0, 4)[0])
    assert not torch.equal(data.train_batch(task, 8, 0, 0)[0], data.eval_set(task, 8, 0)[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(vocab_size=1000, seq_len=64, n_kv=17), "n_kv too large"),
        (dict(vocab_size=64, seq_len=64, n_kv=4), "vocab_size must be larger than seq_len"),
        (dict(vocab_size=32, seq_len=64, n_kv=4), "vocab_size must be larger than seq_len"),
        (dict(vocab_size=1000, seq_len=63, n_kv=4), "seq_len must be even"),
        (dict(vocab_size=1000, seq_len=64, n_kv=0), "n_kv must be >= 1"),
        (dict(vocab_size=1000, seq_len=64, n_kv=4, power_a=0.0), "power_a must be > 0"),
        (dict(vocab_size=1000, seq_len=64, n_kv=4, power_a=float("nan")), "power_a"),
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MQARTask(**kwargs)


def test_bad_types_and_counts() -> None:
    with pytest.raises(TypeError, match="seq_len must be an int"):
        MQARTask(vocab_size=1000, seq_len=64.0, n_kv=4)
    with pytest.raises(ValueError, match="num_examples"):
        generate(MQARTask(), 0, rng=0)
    with pytest.raises(TypeError, match="task must be an MQARTask"):
        generate({"seq_len": 64}, 3, rng=0)


def test_training_mixture_of_key_value_counts() -> None:
    task = MQARTask(vocab_size=300, seq_len=128, n_kv=16)
    inputs, labels = data.train_batch(task, 12, seed=0, step=5, mix=(4, 8, 16))
    asked = (labels != IGNORE_INDEX).sum(1).tolist()
    assert asked == [4] * 4 + [8] * 4 + [16] * 4  # equal shares, in the order of mix
    for n, rows in ((4, slice(0, 4)), (8, slice(4, 8)), (16, slice(8, 12))):
        check_sequences(MQARTask(300, 128, n), inputs[rows], labels[rows])
    again = data.train_batch(task, 12, seed=0, step=5, mix=(4, 8, 16))
    assert torch.equal(inputs, again[0])
    with pytest.raises(ValueError, match="multiple of len"):
        data.train_batch(task, 10, seed=0, step=0, mix=(4, 8, 16))
    with pytest.raises(ValueError, match="n_kv too large"):
        data.train_batch(task, 8, seed=0, step=0, mix=(16, 40))
