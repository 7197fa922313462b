"""Multi-query associative recall (MQAR) data, after Arora et al. (2023), "Zoology".

Reference: arXiv 2312.04927.

The task behind the recall trade-off of the spec (sections 6.3, 7.3, 9): a sequence first lists
``n_kv`` key-value pairs, then asks for the keys again, one by one, and the model must answer each
query with the value that followed that key in the context.

Layout of one sequence of ``seq_len`` tokens (T = seq_len, n = n_kv, V = vocab_size)::

    positions 0 .. 2n-1     k_1 v_1 k_2 v_2 ... k_n v_n          (the context)
    positions 2n .. T-1     filler, with query k_i placed at position 2n + 2 g_i

* keys are drawn without replacement from the first half of the vocabulary, ``1 .. V/2 - 1``
  (token 0 is the filler token); values without replacement from the second half ``V/2 .. V-1``.
  So a key token can never be mistaken for a value token, and no key repeats within a sequence.
* the query slots are the even offsets ``0, 2, .., 2(s-1)`` after the context, ``s = (T - 2n) // 2``
  of them. Slot ``g`` (0-based; the query then sits ``2g`` tokens after the context) is drawn with
  probability proportional to the power law ``a (g+1)^(a-1)``, exponent ``a = power_a = 0.01``,
  which favours short gaps; the n slots are drawn without replacement, key i going to the i-th slot
  drawn. (Zoology's choice; real text shows power-law gaps between repeated bigrams.) We draw the
  ordered sample with the Gumbel-top-k trick: adding independent Gumbel noise to ``log p`` and
  taking the n largest gives exactly the sequential weighted draw without replacement, vectorised.
* ``labels`` is -100 (ignored by ``cross_entropy``) everywhere except at each query position, where
  it is the value paired with that key: the model reads the key and must predict its value as the
  next token. Accuracy counts these positions only.
* the other positions after the context are filler: token 0, or, with ``random_non_queries=True``
  (Zoology's default, and ours), uniform random tokens from the whole vocabulary, so that the model
  cannot find the queries by looking for the only non-zero tokens.

Worked example: ``generate(MQARTask(vocab_size=20, seq_len=16, n_kv=2, random_non_queries=False),
1, rng=0)`` gives (the tests check this example against the generator)::

    position  0    1    2    3    4    5    6    7    8    9    10   11   12   13   14   15
    input     4    12   3    14   4    0    0    0    0    0    3    0    0    0    0    0
    label     -100 -100 -100 -100 12   -100 -100 -100 -100 -100 14   -100 -100 -100 -100 -100

Keys 4, 3 (< V/2 = 10), values 12, 14 (>= 10); s = (16 - 4) // 2 = 6 slots; key 4 drew slot 0
(position 4, right after the context) and key 3 slot 3 (position 4 + 6 = 10). At position 10 the
model sees key 3 and must emit 14, the token that followed 3 in the context.

Constraints, checked before any work (Zoology asserts the same): ``seq_len`` even, ``vocab_size >
seq_len``, and ``4 n_kv <= seq_len`` (the context takes 2n tokens and the n queries need n of the
(T - 2n) / 2 slots). Differences from Zoology's generator: a ``numpy.random.Generator`` instead of
the global NumPy seed; the weighted draw via Gumbel-top-k (same law); no multi-pass contexts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

IGNORE_INDEX = -100

# Rows generated at once: bounds the (rows x vocab/2) random matrix used to draw distinct keys.
_BLOCK_ROWS = 1024


# The tokens between the queries (``MQARTask.random_non_queries``): "blank" (token 0) or "random"
# (uniform over the vocabulary, Zoology's default).
FILLERS = ("blank", "random")


def filler_name(row: dict) -> str:
    """The fillers ("random" or "blank") of a results row or of ``MQARTask.to_dict()``."""
    return "random" if row.get("random_non_queries") else "blank"


@dataclass(frozen=True)
class MQARTask:
    """The shape of an MQAR problem: vocabulary, sequence length, pairs, gap exponent.

    Construction validates everything (``ValueError`` naming the argument), so a bad configuration
    fails before any model is built or trained.
    """

    vocab_size: int = 8192
    seq_len: int = 64
    n_kv: int = 4
    power_a: float = 0.01
    random_non_queries: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_kv"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.seq_len % 2:
            raise ValueError(
                f"seq_len must be even (keys and values come in pairs and queries sit on even "
                f"offsets), got seq_len={self.seq_len}"
            )
        if self.vocab_size <= self.seq_len:
            raise ValueError(
                f"vocab_size must be larger than seq_len, got vocab_size={self.vocab_size} "
                f"<= seq_len={self.seq_len}"
            )
        if 4 * self.n_kv > self.seq_len:
            raise ValueError(
                f"n_kv too large for seq_len: the context takes 2*n_kv tokens and the queries need "
                f"n_kv of the (seq_len - 2*n_kv)/2 query slots, so n_kv <= seq_len/4 = "
                f"{self.seq_len // 4}; got n_kv={self.n_kv}, seq_len={self.seq_len}"
            )
        # vocab > seq_len >= 4 n_kv guarantees enough distinct keys (V/2 - 1) and values (V - V/2).
        if not (isinstance(self.power_a, (int, float)) and math.isfinite(self.power_a)):
            raise ValueError(f"power_a must be a finite number, got {self.power_a!r}")
        if self.power_a <= 0:
            raise ValueError(f"power_a must be > 0, got {self.power_a}")

    @property
    def n_slots(self) -> int:
        """Number of query slots after the context: ``(seq_len - 2 n_kv) // 2``."""
        return (self.seq_len - 2 * self.n_kv) // 2

    def to_dict(self) -> dict:
        """The task as a plain dict (for JSON results and checkpoint fingerprints)."""
        return asdict(self)


def gap_probabilities(n_slots: int, power_a: float = 0.01) -> np.ndarray:
    """The power law over query slots: ``p(g) = a (g+1)^(a-1) / sum``, g = 0 .. n_slots-1."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    weights = power_a * np.arange(1, n_slots + 1, dtype=np.float64) ** (power_a - 1.0)
    return weights / weights.sum()


def _distinct_draws(rng: np.random.Generator, rows: int, low: int, high: int, k: int) -> np.ndarray:
    """``rows`` independent draws of k distinct integers, uniform on [low, high); [rows, k]."""
    noise = rng.random((rows, high - low))
    # argpartition then argsort of the k smallest: a uniform random ordered k-subset per row.
    part = np.argpartition(noise, k - 1, axis=1)[:, :k]
    order = np.argsort(np.take_along_axis(noise, part, axis=1), axis=1)
    return np.take_along_axis(part, order, axis=1) + low


def _weighted_slots(rng: np.random.Generator, rows: int, p: np.ndarray, k: int) -> np.ndarray:
    """Ordered weighted draws of k distinct slots without replacement (Gumbel-top-k), [rows, k]."""
    gumbel = -np.log(-np.log(rng.random((rows, p.size))))
    scores = np.log(p)[None, :] + gumbel  # [rows, n_slots]
    top = np.argsort(-scores, axis=1)[:, :k]
    return top


def _generate_block(task: MQARTask, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    n, T, V = task.n_kv, task.seq_len, task.vocab_size
    half = V // 2
    keys = _distinct_draws(rng, rows, 1, half, n)  # [rows, n]
    values = _distinct_draws(rng, rows, half, V, n)  # [rows, n]
    slots = _weighted_slots(rng, rows, gap_probabilities(task.n_slots, task.power_a), n)

    inputs = np.zeros((rows, T), dtype=np.int64)
    if task.random_non_queries:
        inputs[:, 2 * n :] = rng.integers(0, V, size=(rows, T - 2 * n))
    labels = np.full((rows, T), IGNORE_INDEX, dtype=np.int64)
    inputs[:, 0 : 2 * n : 2] = keys
    inputs[:, 1 : 2 * n : 2] = values
    query_pos = 2 * n + 2 * slots  # [rows, n]
    np.put_along_axis(inputs, query_pos, keys, axis=1)
    np.put_along_axis(labels, query_pos, values, axis=1)
    return inputs, labels, slots


def generate(
    task: MQARTask, num_examples: int, rng: np.random.Generator | int, *, return_slots: bool = False
) -> tuple[torch.Tensor, ...]:
    """Draw ``num_examples`` MQAR sequences.

    Returns ``(inputs, labels)``, both int64 ``[num_examples, seq_len]`` (labels -100 except at the
    n_kv query positions per row); with ``return_slots=True`` also the query slots ``[N, n_kv]``
    (slot g of key i means the query for key i sits at position ``2 n_kv + 2 g``). ``rng`` is a
    ``numpy.random.Generator`` or an int seed; the same seed gives the same data.
    """
    if not isinstance(task, MQARTask):
        raise TypeError(f"task must be an MQARTask, got {type(task).__name__}")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"num_examples must be an int >= 1, got {num_examples!r}")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    blocks = [
        _generate_block(task, min(_BLOCK_ROWS, num_examples - start), rng)
        for start in range(0, num_examples, _BLOCK_ROWS)
    ]
    inputs, labels, slots = (np.concatenate(parts) for parts in zip(*blocks, strict=True))
    out = (torch.from_numpy(inputs), torch.from_numpy(labels))
    return out + (torch.from_numpy(slots),) if return_slots else out


def train_batch(
    task: MQARTask, batch_size: int, seed: int, step: int, mix: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, ...]:
    """The training batch of step ``step``: fresh sequences, a pure function of (seed, step).

    Drawing each batch from its own seed (instead of a stream) is what lets a resumed run see
    exactly the batches the uninterrupted run would have seen. ``mix``: key-value counts to train
    on, in equal shares of the batch (Zoology trains on a mixture of counts and tests each); None
    means ``task.n_kv`` alone. Every count must fit ``task.seq_len`` (``ValueError`` otherwise).
    """
    tasks = [task] if mix is None else mix_tasks(task, mix)
    if batch_size % len(tasks):
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of len(mix) ({len(tasks)})")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, step)))
    parts = [generate(t, batch_size // len(tasks), rng) for t in tasks]
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


def mix_tasks(task: MQARTask, mix: tuple[int, ...]) -> list[MQARTask]:
    """``task`` with each key-value count of ``mix`` (validated like any task)."""
    if not mix:
        raise ValueError("mix must name at least one key-value count")
    return [replace(task, n_kv=n) for n in mix]


def eval_set(task: MQARTask, num_examples: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The held-out evaluation set: drawn from a seed stream disjoint from every training batch."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    return generate(task, num_examples, rng)
