"""The examples outside the package run as a user would run them (examples/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from linattn import registry
from linattn.ops import delta_rule
from linattn.testing import check_rule

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_user_rule_passes_the_property_checks(implicit_delta):
    errors = check_rule("implicit_delta")
    assert max(errors.values()) < 1e-12


def test_with_unit_keys_it_is_the_delta_rule_of_strength_beta_over_1_plus_beta(implicit_delta):
    module = implicit_delta
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 40, 2, 8, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(1, 40, 2, 8, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 40, 2, 5, generator=gen, dtype=torch.float64)
    beta = 3 * torch.rand(1, 40, 2, generator=gen, dtype=torch.float64)  # beyond [0, 2] too
    g = -torch.rand(1, 40, 2, 8, generator=gen, dtype=torch.float64)
    for mode in ("chunk", "recurrent", "parallel"):
        o, _ = module.implicit_delta_rule(q, k, v, beta, g, mode=mode, chunk_size=16)
        want, _ = delta_rule(q, k, v, beta / (1 + beta), g, mode=mode, chunk_size=16)
        torch.testing.assert_close(o, want, rtol=0, atol=1e-12)


def test_its_bad_input_is_named(implicit_delta):
    module = implicit_delta
    q = torch.randn(1, 4, 1, 3)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, inf\]"):
        module.implicit_delta_rule(q, q, q, -torch.ones(1, 4, 1))
    with pytest.raises(TypeError, match="missing \\['beta'\\]"):
        module.implicit_delta_rule(q, q, q, None)


def test_its_entry_appears_in_the_tools(implicit_delta):
    from linattn.experiments import _bench_cases
    from linattn.experiments.accuracy import compute_accuracy

    entry = registry.get("implicit_delta")
    rows = [r for r in compute_accuracy(T=30, K=4, V=3) if r["name"] == "implicit_delta"]
    assert [r["form"] for r in rows] == ["parallel", "recurrent", "chunk"]
    assert max(r["float64"] for r in rows) < 1e-12
    x = _bench_cases.make_inputs(entry, 1, 16, 2, 4, 4)
    assert _bench_cases.call(entry, x, "chunk", 8).shape == (1, 16, 2, 4)


def test_the_example_runs_as_a_script():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "implicit_delta_rule.py")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "check_rule: " in done.stdout and "implicit delta rule" in done.stdout
