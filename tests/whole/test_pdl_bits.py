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
        "where": {},  # one-dimensional: no image to place it in
    }
    b["c1"] = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float16)
    assert bits._first_difference(list(a), a, b)["first_differing"] == "c1"
    assert bits._first_difference(list(a), a, dict(a)) == {"first_differing": None}


def test_where_two_activations_differ_by_row_column_and_channel(bits):
    """Two images of 4×4 pixels, 3 channels: differences at (image 1, row 2, column 3, channel 0) and (1, 2, 0, 2)."""
    a = torch.zeros(2 * 16, 3)
    b = a.clone()
    b[16 + 2 * 4 + 3, 0] = 1.0
    b[16 + 2 * 4 + 0, 2] = 1.0
    got = bits._where(a, b, 2)
    assert got["images"] == 1 and got["rows"] == [[2, 2]]
    assert sorted(got["columns"]) == [[0, 1], [3, 1]] and sorted(got["channels"]) == [[0, 1], [2, 1]]
    assert bits._where(a[:30], b[:30], 2) == {}  # 15 pixels an image: not square
