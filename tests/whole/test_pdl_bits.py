"""benchmarks/pdl_bits.py: the first tensor whose bits differ between two eager runs, and how many differ.

Why: the script names the kernel a PDL race (or a nondeterministic kernel) lies in; a comparison that skipped a
tensor, or counted NaN against NaN as a difference, would point at the wrong one.
"""

from __future__ import annotations

import pytest
import torch
from repo_paths import imported_benchmark


@pytest.fixture
def bits():
    yield from imported_benchmark("pdl_bits")


def test_the_first_differing_tensor_in_the_order_made(bits):
    a = {
        "x": torch.zeros(4),
        "c1": torch.ones(3),
        "c2": torch.tensor([1.0, float("nan")]),
        "c3": torch.ones(2),
    }
    b = {**a, "c2": torch.tensor([1.0, float("nan")]), "c3": torch.tensor([1.0, 1.5])}
    assert bits._first_difference(list(a), a, b) == {
        "first_differing": "c3",
        "differ": 1,
        "of": 2,
        "max_abs": 0.5,
    }
    b["c1"] = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float16)
    assert bits._first_difference(list(a), a, b)["first_differing"] == "c1"
    assert bits._first_difference(list(a), a, dict(a)) == {"first_differing": None}
