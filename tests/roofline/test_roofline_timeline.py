"""The critical path of a replayed step (`deepgap.roofline.timeline`): labels, adds, idle and their sum."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepgap.roofline.timeline import critical_path, labels, table
from deepgap.roofline.trace import KernelEvent


def kernel(name: str, ts: float, dur: float, kind: str = "kernel") -> KernelEvent:
    return KernelEvent(name, "other", ts, dur, kind)


def test_labels_by_place_in_the_layer():
    # two steps of two layers: gemv, attn, gemv each, then a head and an argmax once a step
    step = ["gemv", "attn", "gemv"] * 2 + ["head", "argmax"]
    got = labels(step * 2, steps=2, layers=2)
    assert got[:8] == ["gemv[0]", "attn", "gemv[1]", "gemv[0]", "attn", "gemv[1]", "head", "argmax"]
    assert got[8:] == got[:8]


def test_labels_of_a_few_uses_a_step_and_of_uneven_counts():
    assert labels(["norm", "x", "norm"] * 2, steps=2, layers=4) == ["norm#0", "x", "norm#1"] * 2
    assert labels(["a", "a", "a"], steps=2, layers=1) == ["a", "a", "a"]  # 3 uses in 2 steps: not placed


def test_overlapped_kernels_cost_only_what_they_add():
    # a PDL chain: b starts 2 µs before a ends and ends 3 µs after it; c follows after 1 µs idle
    ks = [kernel("a", 0, 10), kernel("b", 8, 5), kernel("c", 14, 4)]
    t = critical_path(ks, steps=1, layers=1)
    by = {s.label: s for s in t.shares}
    assert t.step_us == 18
    assert (by["a"].adds_us, by["b"].adds_us, by["c"].adds_us) == (10, 3, 4)
    assert (by["c"].idle_us, by["b"].lead_us, by["c"].lead_us) == (1, -2, 1)
    assert by["b"].dur_us == 5
    assert sum(s.cost_us for s in t.shares) == t.step_us
    assert [s.label for s in t.shares] == ["a", "c", "b"]  # largest cost first


def test_a_kernel_inside_another_adds_nothing_and_memcpys_are_left_out():
    ks = [kernel("a", 0, 10), kernel("inner", 2, 3), kernel("copy", 11, 1, kind="memcpy"), kernel("z", 12, 1)]
    by = {s.label: s for s in critical_path(ks, steps=1, layers=1).shares}
    assert by["inner"].adds_us == 0 and by["z"].idle_us == 2 and "copy" not in by
    assert "kernel" in table(critical_path(ks, 1, 1)).splitlines()[1]


def test_no_kernels_or_no_steps_is_an_error_that_says_why():
    with pytest.raises(ValueError, match="no GPU kernels"):
        critical_path([kernel("c", 0, 1, kind="memcpy")], steps=1, layers=1)
    with pytest.raises(ValueError, match="at least 1"):
        critical_path([kernel("a", 0, 1)], steps=0, layers=1)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 20)), min_size=1, max_size=30))
def test_costs_sum_to_the_window(spans):
    ks = [kernel(f"k{i % 3}", ts, dur) for i, (ts, dur) in enumerate(spans)]
    t = critical_path(ks, steps=1, layers=1)
    assert sum(s.cost_us for s in t.shares) == pytest.approx(t.step_us, abs=1e-6)
