"""The collectives context parallelism needs, with byte accounting and clear failures.

Every collective of ``linattn.distributed`` goes through this module, for two reasons:

* **Bytes.** ``count_bytes()`` records the bytes of the tensors this rank *contributes* to each
  collective (the input of an all-gather, the buffer of an all-reduce). That is the quantity whose
  independence from the slice length is the point of section 8's affine maps: it depends on B, H,
  K, V and the number of ranks, never on T. (What travels on the wire also depends on the
  backend's algorithm, e.g. a ring all-gather forwards (P - 1) contributions per rank.)
* **Failures.** A peer that raised, exited or never arrived makes the backend's collective fail
  after the process group's timeout (``init_process_group(timeout=...)``; gloo enforces it on each
  collective, NCCL through its watchdog). We turn that ``RuntimeError`` into a
  ``PeerFailureError`` naming the collective, this rank and the timeout, so that every surviving
  rank stops with a readable error instead of hanging.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


class PeerFailureError(RuntimeError):
    """A collective failed: some rank raised, exited, or did not arrive within the timeout."""


@dataclass(eq=False)  # counters are told apart by identity (nested counters may hold equal counts)
class ByteCount:
    """Bytes this rank contributed to collectives, in total and per collective name."""

    total: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    calls: int = 0

    def add(self, name: str, nbytes: int) -> None:
        self.total += nbytes
        self.by_op[name] = self.by_op.get(name, 0) + nbytes
        self.calls += 1


_COUNTERS: list[ByteCount] = []


@contextlib.contextmanager
def count_bytes() -> Iterator[ByteCount]:
    """Within the block, record the bytes of every tensor this rank hands to a collective.

    Counters nest: an inner block's bytes are also added to every enclosing block's counter.
    """
    counter = ByteCount()
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _record(name: str, x: Tensor) -> None:
    for counter in _COUNTERS:
        counter.add(name, x.numel() * x.element_size())


def rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) of this process in ``group`` (None: the default group).

    Raises ``RuntimeError`` with the fix if no process group was initialised.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "linattn.distributed needs an initialised process group: launch with torchrun and call "
            "linattn.distributed.init_process_group() (or torch.distributed.init_process_group)"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _failed(name: str, group: dist.ProcessGroup | None, error: Exception) -> PeerFailureError:
    rank = dist.get_rank(group) if dist.is_initialized() else -1
    return PeerFailureError(
        f"rank {rank}: collective {name!r} failed: a peer raised, exited or did not arrive within "
        f"the process group's timeout ({type(error).__name__}: {str(error).splitlines()[0]})"
    )


def all_gather(
    x: Tensor, group: dist.ProcessGroup | None = None, name: str = "all_gather"
) -> Tensor:
    """Stack every rank's ``x`` (same shape and dtype on all ranks): returns [P, *x.shape]."""
    _, world = rank_and_size(group)
    x = x.contiguous()
    _record(name, x)
    out = [torch.empty_like(x) for _ in range(world)]
    try:
        dist.all_gather(out, x, group=group)
    except RuntimeError as error:
        raise _failed(name, group, error) from error
    return torch.stack(out)


def all_reduce_sum(
    x: Tensor, group: dist.ProcessGroup | None = None, name: str = "all_reduce"
) -> Tensor:
    """The elementwise sum of every rank's ``x`` (returned as a new tensor)."""
    rank_and_size(group)
    x = x.clone().contiguous()
    _record(name, x)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    except RuntimeError as error:
        raise _failed(name, group, error) from error
    return x


def barrier(group: dist.ProcessGroup | None = None, name: str = "barrier") -> None:
    """Wait until every rank of ``group`` has arrived (no bytes are counted)."""
    rank_and_size(group)
    try:
        dist.barrier(group=group)
    except RuntimeError as error:
        raise _failed(name, group, error) from error


def all_gather_strings(
    text: str, group: dist.ProcessGroup | None = None, name: str = "all_gather_strings"
) -> list[str]:
    """Every rank's ``text`` (used only to share error messages, never on the hot path)."""
    _, world = rank_and_size(group)
    out: list[object] = [None] * world
    try:
        dist.all_gather_object(out, text, group=group)
    except RuntimeError as error:
        raise _failed(name, group, error) from error
    return [str(s) for s in out]


def init_process_group(backend: str | None = None, timeout: float = 60.0, **kwargs: object) -> None:
    """``torch.distributed.init_process_group`` from torchrun's environment, with a timeout.

    backend: "gloo" (CPU tensors) or "nccl" (CUDA tensors); None picks nccl when CUDA is available
    and gloo otherwise. timeout: seconds any collective (and the rendezvous) may wait for a peer
    before every waiting rank raises. With NCCL each process uses the GPU ``LOCAL_RANK``.
    Extra keyword arguments go to ``torch.distributed.init_process_group``.
    """
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        dist.init_process_group(
            backend=backend, timeout=datetime.timedelta(seconds=float(timeout)), **kwargs
        )
    except RuntimeError as error:  # DistStoreError and friends: a peer did not join in time
        raise PeerFailureError(
            f"rendezvous failed within the {timeout:g} s timeout: a peer did not join or the "
            f"address is wrong ({type(error).__name__}: {str(error).splitlines()[0]})"
        ) from error
