"""benchmarks/split_tiles.py's table: per layer the fastest tile of each kind, from the benchmark's JSON rows.

Why: session 41's spread split-K tiles were judged from this table (results/h200/session41); a row misfiled
between the kinds, or a failed candidate counted, would misstate what each kind of tile costs.
"""

from __future__ import annotations

import math

import pytest
from repo_paths import imported_benchmark


@pytest.fixture(scope="module")
def split_tiles():
    yield from imported_benchmark("split_tiles")


def _row(layer, tile, split, spread, us):
    return {"model": "resnet50", "precision": "fp8", "layer": layer, "tile": tile, "split": split,
            "spread": spread, "us": us}  # fmt: skip


def test_each_kind_gives_its_fastest_tile_and_a_failed_one_counts_for_nothing(split_tiles):
    rows = [
        _row("layer4.0.conv2", "64x64x128 w4 s4", 1, False, 13.6),
        _row("layer4.0.conv2", "64x64x128 w4 s4 split12", 12, False, 8.4),
        _row("layer4.0.conv2", "64x64x128 w4 s4 split6", 6, False, 7.9),
        _row("layer4.0.conv2", "64x64x128 w4 s4 split12 spread", 12, True, 6.1),
        _row("layer4.0.conv2", "64x64x128 w4 s4 split6 spread", 6, True, None),  # its check failed
        _row("layer4.0.conv3", "64x64x128 w4 s4 er", 1, False, 3.7),
        _row("layer4.0.conv3", "64x64x128 w4 s4 split2", 2, False, 5.1),
        _row("layer4.0.conv3", "torch", 0, False, 9.0),
    ]
    head, conv2, conv3 = split_tiles.table(rows)
    assert head.split()[:3] == ["model", "prec", "layer"] and head.endswith("best")
    assert conv2.split()[3:6] == ["13.60", "7.90", "6.10"] and conv2.endswith("split12 spread")
    cells = conv3.split()
    assert cells[3:5] == ["3.70", "5.10"] and math.isnan(float(cells[5])) and conv3.endswith("w4 s4 er")
