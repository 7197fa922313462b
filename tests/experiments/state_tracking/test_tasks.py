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
