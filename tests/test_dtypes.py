"""The compute-dtype rule is one function, and the library writes it nowhere else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import linattn
from linattn.dtypes import compute_dtype

ROOT = Path(linattn.__file__).parent


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
    ],
)
def test_float64_stays_float64_else_float32(dtype, expected):
    assert compute_dtype(dtype) is expected


def test_the_ops_take_the_one_function():
    from linattn.ops import _engine

    assert _engine.compute_dtype is compute_dtype


def test_the_rule_is_written_once():
    rule = re.compile(r"float64 if .{0,40}float64 else")
    where = [
        str(p.relative_to(ROOT))
        for p in sorted(ROOT.rglob("*.py"))
        if p.parts[-2] != "reference" and rule.search(p.read_text())
    ]
    assert where == ["dtypes.py"], where
