"""``linattn verify``'s Forgetting Transformer lines: there, passing to 1e-12 in
float64, and failing when the gates' cumulative sum is broken (the gates then shift the logits
even when they are zero) or when the blockwise form's rescaling is dropped."""

from __future__ import annotations

from linattn.experiments import verify
from linattn.experiments.verify import SECTIONS
from linattn.ops import softmax_variants

NAMES = [
    "FoX with log f = 0 (loop) is softmax attention",
    "FoX with log f = 0 (parallel form) is softmax attention",
    "FoX with log f = 0 (chunk form) is softmax attention",
    "FoX: the parallel form equals the loop",
    "FoX: the chunk form equals the loop",
]


def test_the_forgetting_checks_are_there_and_pass():
    checks = verify.forgetting_checks()
    assert [c.name for c in checks] == NAMES
    assert all(c.passed and c.error < 1e-12 for c in checks), [c.line() for c in checks]
    assert verify.forgetting_checks in SECTIONS


def test_the_checks_fail_when_the_op_breaks(monkeypatch):
    # the masked product with keys 10% too long: its logits no longer softmax attention's
    real = softmax_variants._fox_parallel

    def broken(q, k, v, g, sink, scale, window_size):
        return real(q, 1.1 * k, v, g, sink, scale, window_size)

    monkeypatch.setattr(softmax_variants, "_fox_parallel", broken)
    failed = [c.name for c in verify.forgetting_checks() if not c.passed]
    assert failed == [NAMES[1], NAMES[3]]


def test_the_checks_fail_when_the_zero_gates_are_not_zero(monkeypatch):
    # the parallel and chunk forms with a gate cumulative sum that starts at 1, not 0, per token:
    # G_t - G_s = (t - s) for zero gates, so the forms no longer equal softmax attention
    real = softmax_variants.forgetting_attention

    def broken(q, k, v, g=None, **kwargs):
        return real(q, k, v, None if g is None else g + 1.0, **kwargs)

    monkeypatch.setattr(softmax_variants, "forgetting_attention", broken)
    failed = [c.name for c in verify.forgetting_checks() if not c.passed]
    assert failed == NAMES[1:]
