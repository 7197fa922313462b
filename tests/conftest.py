"""Fixtures shared by test folders (each folder's conftest.py holds its own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def worker_env() -> dict[str, str]:
    """The environment a launched rank needs to import this tree's ``linattn`` (run_local's env)."""
    return {"PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
