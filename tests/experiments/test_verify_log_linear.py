"""``linattn verify``'s log-linear attention lines: there, passing, and failing where
the op's hierarchy is broken (a level's weight read from the wrong level, or the higher levels
never read)."""

from __future__ import annotations

import torch

from linattn.experiments import verify
from linattn.experiments.verify import SECTIONS
from linattn.ops import log_linear

FORMS = ("parallel", "recurrent", "chunk")
ONE = [f"log-linear Mamba-2, one level = Mamba-2 ({m})" for m in FORMS]
EVERY = [f"log-linear, every level = masked product ({m})" for m in FORMS]
GDN_ONE = [f"log-linear GDN, one level = Gated DeltaNet ({m})" for m in FORMS]
GDN_EVERY = [f"log-linear GDN, every level = masked product ({m})" for m in FORMS]


def test_the_log_linear_checks_are_there_and_pass():
    checks = verify.log_linear_checks()
    assert [c.name for c in checks] == ONE + EVERY + GDN_ONE + GDN_EVERY
    assert all(c.passed and c.error < 1e-12 for c in checks), [c.line() for c in checks]
    assert verify.log_linear_checks in SECTIONS


def test_a_level_weight_read_one_level_off_fails_the_hierarchy_checks(monkeypatch):
    op = log_linear.log_linear_attention

    def shifted(q, k, v, g, level_scales, **kw):  # lambda^(l + 1) read as lambda^(l)
        return op(q, k, v, g, torch.roll(level_scales, 1, dims=-1), **kw)

    monkeypatch.setattr(log_linear, "log_linear_attention", shifted)
    failed = [c.name for c in verify.log_linear_checks() if not c.passed]
    assert failed == EVERY + GDN_EVERY  # all-ones weights are blind to the shift


def test_an_op_that_reads_only_the_two_lowest_levels_fails_every_check(monkeypatch):
    op = log_linear.log_linear_attention

    def truncated(q, k, v, g, level_scales, **kw):  # the levels >= 2 never read
        cut = torch.zeros_like(level_scales)
        cut[..., :2] = level_scales[..., :2]
        return op(q, k, v, g, cut, **kw)

    monkeypatch.setattr(log_linear, "log_linear_attention", truncated)
    failed = [c.name for c in verify.log_linear_checks() if not c.passed]
    assert failed == ONE + EVERY + GDN_ONE + GDN_EVERY


def test_writes_that_do_not_read_the_state_fail_the_gdn_checks(monkeypatch):
    op = log_linear.log_linear_attention

    def additive(q, k, v, g, level_scales, beta=None, **kw):  # beta v written, no state read
        return op(q, k, v * beta[..., None], g, level_scales, **kw) if beta is not None else op(
            q, k, v, g, level_scales, **kw)  # fmt: skip

    monkeypatch.setattr(log_linear, "log_linear_attention", additive)
    failed = [c.name for c in verify.log_linear_checks() if not c.passed]
    assert failed == GDN_ONE + GDN_EVERY
