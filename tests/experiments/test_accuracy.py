"""linattn accuracy: the table of errors against the float64 oracle, and its bounds."""

from __future__ import annotations

from linattn import registry
from linattn.experiments.accuracy import accuracy_markdown, compute_accuracy


def test_accuracy_table_within_the_issue_bounds():
    rows = compute_accuracy(T=70, K=4, V=3)
    assert len(rows) == sum(len(e.forms) for e in registry.mechanisms())
    assert {(r["name"], r["form"]) for r in rows} == {
        (e.name, form) for e in registry.mechanisms() for form in e.forms
    }
    for r in rows:
        assert r["float64"] < 1e-10, r
        assert r["float32"] < 1e-5, r
        assert r["bfloat16"] < 1e-2, r
        assert r["float16"] < 2e-3, r  # 11 significant bits against bfloat16's 8
    text = accuracy_markdown(rows, 70, 4, 3)
    assert text.count("\n| ") == len(rows) + 1 and "KDA" in text
    assert "float16 rel RMS" in text.splitlines()[2].replace("bfloat16 rel RMS", "")
