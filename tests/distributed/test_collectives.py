"""In-process checks of the collectives layer: errors that need no peers."""

from __future__ import annotations

import pytest
import torch

import linattn.distributed as ld


def test_ops_need_a_process_group():
    q = torch.randn(1, 3, 1, 2)
    with pytest.raises(RuntimeError, match="initialised process group"):
        ld.linear_attention(q, q, q)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"timeout": 0}, "timeout"), ({"timeout": "5"}, "timeout"), ({"backend": "mpi"}, "backend")],
)
def test_init_process_group_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ld.init_process_group(**kwargs)


def test_byte_counters_nest():
    with ld.count_bytes() as outer:
        with ld.count_bytes() as inner:
            from linattn.distributed.collectives import _record

            _record("maps", torch.zeros(3, dtype=torch.float64))
        _record("descriptor", torch.zeros(2, dtype=torch.int64))
    assert inner.total == 24 and inner.by_op == {"maps": 24}
    assert outer.total == 40 and outer.by_op == {"maps": 24, "descriptor": 16}
