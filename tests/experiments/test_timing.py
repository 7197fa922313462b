"""`linattn.experiments._timing`: medians and timing in turns (structure, never speed)."""

from linattn.experiments import _timing


def test_median_of_odd_and_even_counts():
    assert _timing.median([3.0, 1.0, 2.0]) == 2.0
    assert _timing.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_medians_in_turns_alternate_the_calls():
    calls = []
    medians = _timing.medians_in_turns([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 3
    assert len(medians) == 2 and all(m >= 0 for m in medians)
