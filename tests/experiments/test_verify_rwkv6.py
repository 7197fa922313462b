"""``linattn verify``'s RWKV-6 lines: there, passing, and failing where the chunk form
reads the state after the token's write (the inclusive gate) instead of before it."""

from __future__ import annotations

from linattn.experiments import verify
from linattn.experiments.verify import SECTIONS

NAMES = [
    *(f"RWKV-6: chunks of C = {C} equal the recurrence" for C in (1, 5, 16, 64)),
    "RWKV-6 with u = 1 and no decay is linear attention",
]


def test_the_rwkv6_checks_are_there_and_pass():
    checks = verify.rwkv6_checks()
    assert [c.name for c in checks] == NAMES
    assert all(c.passed and c.error < 1e-14 for c in checks), [c.line() for c in checks]
    assert verify.rwkv6_checks in SECTIONS


def test_the_chunk_checks_fail_with_the_inclusive_gate(monkeypatch):
    monkeypatch.setattr(verify.rwkv6, "exclusive", lambda G: G)
    failed = [c.name for c in verify.rwkv6_checks() if not c.passed]
    assert failed == NAMES[:4]
