"""State-tracking tasks: the word problem of a finite group, one label per token.

Each sequence is a word g_1 g_2 .. g_T of uniform random group elements (token = the element's
index); the label of token t is the index of the running product c_t = g_t o .. o g_1. Every task
of the benchmark is such a word problem (Liu et al. 2023, Grazzi et al. 2025, Siems et al. 2025):

    parity  Z_2 (the running sum of bits modulo 2)   mod3, mod5   Z_3, Z_5 (addition modulo m)
    S3      the 6 permutations of 3 items            A5, S5       the 60 even / 120 permutations
                                                                  of 5 items

Z_m is built as the rotations of m items, so all groups are permutation groups and composing two
elements is ``p[q]`` (first q, then p). ``cayley[a, b]`` is the index of ``element a o element b``,
so ``c_t = cayley[g_t, c_{t-1}]``.

Worked example: ``generate(GROUPS["parity"], 1, 6, rng=0)`` gives inputs ``1 1 0 1 0 0`` ->
labels ``1 0 0 1 1 1`` (the tests check such a sequence against a direct count).

A curriculum over lengths (``StateTask.curriculum_every`` k > 0): the training words of step s
are ``min(seq_len, 4 * 2**(s // k))`` tokens long, 4, 8, 16, .. up to the training length, so that
the model meets the group's product on short words first (with the loss at every token of 64 from
the start, DeltaProduct n_h = 2 stayed at S_3's sign, 1/3, in 1,000 steps; with k = 100 it solved
S_3 on the same seed: the numbers in the README's state-tracking section).

The batch of training step s is a pure function of (seed, s), the evaluation set at each length of
(seed, length), from disjoint seed streams (as ``linattn.experiments.mqar.data``): a resumed run
sees exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch


def _even(p: tuple[int, ...]) -> bool:
    inversions = sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p)))
    return inversions % 2 == 0


@dataclass(frozen=True)
class Group:
    """A finite permutation group given by its elements (each a tuple, p[j] = the image of j)."""

    name: str
    description: str
    elements: tuple[tuple[int, ...], ...]

    @property
    def order(self) -> int:
        """Number of elements: the vocabulary of inputs and labels."""
        return len(self.elements)

    @property
    def identity(self) -> int:
        """Index of the identity permutation."""
        return self.elements.index(tuple(range(len(self.elements[0]))))

    @cached_property
    def cayley(self) -> np.ndarray:
        """``[order, order]``: index of a o b (first b, then a)."""
        index = {p: i for i, p in enumerate(self.elements)}
        return np.array(
            [[index[tuple(a[j] for j in b)] for b in self.elements] for a in self.elements]
        )


def cyclic(m: int) -> tuple[tuple[int, ...], ...]:
    """Z_m as the m rotations of m items; rotation r is element r, so products add modulo m."""
    return tuple(tuple((j + r) % m for j in range(m)) for r in range(m))


def symmetric(n: int, even_only: bool = False) -> tuple[tuple[int, ...], ...]:
    """S_n (or A_n, the even permutations), in lexicographic order."""
    return tuple(p for p in itertools.permutations(range(n)) if not even_only or _even(p))


GROUPS: dict[str, Group] = {
    "parity": Group("parity", "Z_2: parity of a bit string", cyclic(2)),
    "mod3": Group("mod3", "Z_3: a running sum modulo 3", cyclic(3)),
    "mod5": Group("mod5", "Z_5: a running sum modulo 5", cyclic(5)),
    "S3": Group("S3", "S_3: the word problem of 6 permutations", symmetric(3)),
    "A5": Group("A5", "A_5: the word problem of 60 even permutations", symmetric(5, True)),
    "S5": Group("S5", "S_5: the word problem of 120 permutations", symmetric(5)),
}


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def generate(
    group: Group, num_examples: int, seq_len: int, rng: np.random.Generator | int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_examples`` words of ``seq_len`` elements and their running products.

    Returns ``(inputs, labels)``, int64 ``[num_examples, seq_len]``, both in ``0 .. order - 1``.
    """
    if not isinstance(group, Group):
        raise TypeError(f"group must be a Group, got {type(group).__name__}")
    _check_positive("num_examples", num_examples)
    _check_positive("seq_len", seq_len)
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    words = rng.integers(0, group.order, size=(num_examples, seq_len))
    labels = np.empty_like(words)
    current = np.full(num_examples, group.identity)
    for t in range(seq_len):  # c_t = g_t o c_{t-1}
        current = group.cayley[words[:, t], current]
        labels[:, t] = current
    return torch.from_numpy(words), torch.from_numpy(labels)


CURRICULUM_START = 4  # the first training words of a curriculum, in tokens


@dataclass(frozen=True)
class StateTask:
    """A word problem at one training length, in the form ``mqar.train.train`` trains on.

    ``curriculum_every``: 0 (every training word ``seq_len`` long) or k >= 1, the words of step s
    ``min(seq_len, 4 * 2**(s // k))`` long (the module docstring); held-out words are always
    ``seq_len`` long unless asked for another length.
    """

    group: str
    seq_len: int
    curriculum_every: int = 0

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"unknown task {self.group!r}; choose from {list(GROUPS)}")
        _check_positive("seq_len", self.seq_len)
        k = self.curriculum_every
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"curriculum_every must be an int >= 0, got {k!r}")

    def train_len(self, step: int) -> int:
        """Length of the training words of step ``step``: ``seq_len``, or the curriculum's."""
        if not self.curriculum_every:
            return self.seq_len
        doublings = min(step // self.curriculum_every, self.seq_len.bit_length())
        return min(self.seq_len, CURRICULUM_START * 2**doublings)

    @property
    def vocab_size(self) -> int:
        """Inputs and labels are group elements."""
        return GROUPS[self.group].order

    def train_batch(self, batch_size: int, seed: int, step: int) -> tuple[torch.Tensor, ...]:
        """The batch of training step ``step``, a pure function of (seed, step)."""
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, step)))
        return generate(GROUPS[self.group], batch_size, self.train_len(step), rng)

    def eval_set(self, num_examples: int, seed: int, seq_len: int | None = None):
        """Held-out words at ``seq_len`` (default: the training length), from their own stream."""
        seq_len = self.seq_len if seq_len is None else seq_len
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, seq_len)))
        return generate(GROUPS[self.group], num_examples, seq_len, rng)

    def to_dict(self) -> dict:
        """The task's settings, for the checkpoint fingerprint and the results."""
        curriculum = {"curriculum_every": self.curriculum_every} if self.curriculum_every else {}
        return {"group": self.group, "seq_len": self.seq_len, **curriculum}
