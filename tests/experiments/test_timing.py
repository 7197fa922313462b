"""`linattn.experiments._timing`: medians, timing in turns and peak memory (structure, never
speed)."""

import pytest
import torch

from linattn.experiments import _timing
from linattn.ops import _native


def test_median_of_odd_and_even_counts():
    assert _timing.median([3.0, 1.0, 2.0]) == 2.0
    assert _timing.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_medians_in_turns_alternate_the_calls():
    calls = []
    medians = _timing.medians_in_turns([lambda: calls.append("a"), lambda: calls.append("b")], 3)
    assert calls == ["a", "b"] * 3
    assert len(medians) == 2 and all(m >= 0 for m in medians)


def test_times_in_turns_keep_each_turn():
    calls = []
    times = _timing.times_in_turns([lambda: calls.append("a"), lambda: calls.append("b")], 4)
    assert calls == ["a", "b"] * 4
    assert [len(t) for t in times] == [4, 4] and all(x >= 0 for t in times for x in t)


def test_paired_ratios_are_the_turns_own():
    # turns (2, 1), (4, 4), (9, 3): ratios 2, 1, 3; the medians' ratio would be 4 / 3
    assert _timing.paired_ratios([2.0, 4.0, 9.0], [1.0, 4.0, 3.0]) == {
        "median": 2.0,
        "low": 1.0,
        "high": 3.0,
    }
    with pytest.raises(ValueError):
        _timing.paired_ratios([1.0, 2.0], [1.0])


@pytest.mark.skipif(not _timing.memory_supported(), reason="needs Linux /proc")
def test_peak_extra_bytes_counts_memory_an_earlier_call_left_in_the_cache():
    if not _native.available():
        pytest.skip(f"fused code unavailable: {_native.reason()}")
    size = (16, 2**20)  # 64 MiB

    def fn():
        return _native.empty(size, torch.zeros(1)).fill_(1.0)

    del_me = fn()  # resident, then kept by the fused code's cache for the next 64 MiB tensor
    del del_me
    assert _native.cache_bytes() >= 64 * 2**20
    assert _timing.peak_extra_bytes(fn) >= 60 * 2**20
