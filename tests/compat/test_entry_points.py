"""Every one of fla 0.6.0's op entry points has a compat function with fla's signature."""

from __future__ import annotations

import inspect
import re

import pytest

from linattn import compat

PATTERN = re.compile(r"^(chunk_|fused_recurrent_|fused_chunk_|parallel_)")


def test_fifty_nine_entry_points():
    # fla 0.6.0's 59 pattern-named entry points, plus the others (fused_attnres)
    n = 59 + len(compat.FLA_OTHER_ENTRY_POINTS)
    assert len(compat.FLA_ENTRY_POINTS) == n
    assert len(set(compat.FLA_ENTRY_POINTS)) == n
    for name in compat.FLA_ENTRY_POINTS:
        assert callable(getattr(compat, name)), name


def test_fla_entry_points_each_have_a_compat_function():
    ops = pytest.importorskip("fla.ops")
    names = {n for n in dir(ops) if PATTERN.match(n) and callable(getattr(ops, n))}
    others = set(compat.FLA_OTHER_ENTRY_POINTS)
    assert others <= set(ops.__all__) and not names & others
    assert names | others == set(compat.FLA_ENTRY_POINTS)


def _fla(name):
    ops = pytest.importorskip("fla.ops")
    return getattr(ops, name)


@pytest.mark.parametrize(
    "name", compat.COMPUTED + compat.DEPRECATED + compat.FLA_OTHER_ENTRY_POINTS
)
def test_signature_is_fla_s(name):
    """Same parameter names, positional order, kinds and defaults as fla's function."""
    ours = inspect.signature(getattr(compat, name)).parameters
    theirs = inspect.signature(_fla(name)).parameters
    assert list(ours) == list(theirs)
    for p in theirs:
        assert ours[p].kind == theirs[p].kind, p
        assert ours[p].default == theirs[p].default, p


@pytest.mark.parametrize("name", sorted(compat.FLA_SUBMODULE_ENTRY_POINTS))
def test_submodule_entry_points_have_fla_s_signature(name):
    """chunk_gdn2 / fused_recurrent_gdn2: fla exports them from fla.ops.gdn2 only."""
    module = pytest.importorskip(compat.FLA_SUBMODULE_ENTRY_POINTS[name])
    ours = inspect.signature(getattr(compat, name)).parameters
    theirs = inspect.signature(getattr(module, name)).parameters
    assert list(ours) == list(theirs)
    for p in theirs:
        assert ours[p].kind == theirs[p].kind, p
        assert ours[p].default == theirs[p].default, p


def test_missing_mechanisms_raise_naming_what_is_missing():
    # fla 0.6.0's every entry point computes (MISSING is empty); an entry point made for a
    # missing mechanism still refuses every call, naming it
    from linattn.compat import unsupported

    made = unsupported._missing("chunk_example", "an example mechanism")
    with pytest.raises(NotImplementedError, match="linattn.compat.chunk_example: linattn does not"):
        made(None, None, None)
    for name in compat.MISSING:
        with pytest.raises(NotImplementedError, match=rf"linattn.compat.{name}: linattn does not"):
            getattr(compat, name)(None, None, None)


@pytest.mark.parametrize("name", compat.DEPRECATED)
def test_deprecated_fused_chunk_functions_raise_as_fla_s(name):
    with pytest.raises(NotImplementedError, match="deprecated"):
        getattr(compat, name)(q=None)
