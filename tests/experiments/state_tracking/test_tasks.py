"""The word problems: labels are the running products, batches a pure function of (seed, step)."""

import numpy as np
import pytest
import torch

from linattn.experiments.state_tracking.tasks import GROUPS, StateTask, generate
from linattn.reference.state_tracking import running_compositions


def test_orders_and_closure():
    assert {name: g.order for name, g in GROUPS.items()} == {
        "parity": 2, "mod3": 3, "mod5": 5, "S3": 6, "A5": 60, "S5": 120,
    }  # fmt: skip
    for group in GROUPS.values():
        table = group.cayley
        assert sorted(np.unique(table)) == list(range(group.order))  # closed
        assert all(sorted(row) == list(range(group.order)) for row in table)  # a Latin square
        e = group.identity
        assert np.array_equal(table[e], np.arange(group.order))


def test_parity_and_modular_sums_are_running_sums():
    for name, m in (("parity", 2), ("mod3", 3), ("mod5", 5)):
        inputs, labels = generate(GROUPS[name], 16, 40, rng=1)
        assert torch.equal(labels, torch.cumsum(inputs, dim=1) % m)


@pytest.mark.parametrize("name", ["S3", "A5", "S5"])
def test_word_problem_labels_are_the_running_composition(name):
    group = GROUPS[name]
    inputs, labels = generate(group, 4, 30, rng=2)
    elements = np.array(group.elements)
    for word, label in zip(inputs.numpy(), labels.numpy(), strict=True):
        want = running_compositions(elements[word])
        assert np.array_equal(elements[label], want)


def test_batches_are_a_pure_function_of_seed_and_step():
    task = StateTask("S3", 32)
    a, b = task.train_batch(8, 0, 5), task.train_batch(8, 0, 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(task.train_batch(8, 0, 6)[0], a[0])
    assert not torch.equal(task.eval_set(8, 0)[0], a[0])
    assert task.eval_set(8, 0, 128)[0].shape == (8, 128)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown task"):
        StateTask("S7", 32)
    with pytest.raises(ValueError, match="seq_len must be an int >= 1"):
        StateTask("S3", 0)
    with pytest.raises(TypeError, match="group must be a Group"):
        generate("S3", 2, 4, rng=0)


def test_the_curriculum_doubles_the_training_length_up_to_seq_len():
    task = StateTask("S3", 64, curriculum_every=10)
    lengths = [task.train_len(step) for step in (0, 9, 10, 29, 30, 40, 50, 10**9)]
    assert lengths == [4, 4, 8, 16, 32, 64, 64, 64]
    inputs, labels = task.train_batch(3, seed=0, step=25)
    assert inputs.shape == labels.shape == (3, 16)
    # the batch is generate()'s words of the curriculum's length, from the step's own stream
    want = generate(
        GROUPS["S3"], 3, 16, np.random.default_rng(np.random.SeedSequence(0, spawn_key=(0, 25)))
    )
    assert torch.equal(inputs, want[0]) and torch.equal(labels, want[1])
    assert task.eval_set(2, seed=0)[0].shape == (2, 64)  # held out at the training length
    assert StateTask("S3", 3, curriculum_every=1).train_len(0) == 3  # never above seq_len
    assert (
        StateTask("S3", 64).train_len(0) == 64
        and "curriculum_every" not in StateTask("S3", 64).to_dict()
    )
    assert task.to_dict()["curriculum_every"] == 10
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="curriculum_every must be an int >= 0"):
            StateTask("S3", 64, curriculum_every=bad)
