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


@pytest.fixture
def implicit_delta():
    """examples/implicit_delta_rule.py loaded as a user would (from outside src/) and registered
    (its rule and its mechanism), then removed again; yields the example's module."""
    import importlib.util

    from linattn import registry
    from linattn.ops import rules

    path = SRC.parent / "examples" / "implicit_delta_rule.py"
    spec = importlib.util.spec_from_file_location("example_implicit_delta_rule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register()
    yield module
    registry.unregister("implicit_delta")
    rules.unregister("implicit_delta")
