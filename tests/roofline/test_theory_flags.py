"""The "theoretical vs measured" table: 8-bit bytes at 1 byte an element, and a time that beats a bound flagged.

Why: quant int8/fp8 rows of the committed H100/H200 stores measured 0.87-0.99 of their "theoretical" time
and the table printed that ratio as plainly as any other. The bytes were not the cause (int8 and fp8 count
1 byte an element, half of fp16's); the bound was: eager traffic is what unfused PyTorch moves, and a
fusing engine (quant, compile-freeze) moves less. Such a row is now flagged, and a time below the floor
that no engine can beat (FLOPs / peak, fewest bytes / bandwidth) is flagged as one that cannot be true.
"""

from __future__ import annotations

import pandas as pd
import pytest

from deepgap.roofline import figures_paper as rfp
from deepgap.roofline.model import model_cost
from deepgap.roofline.report_section import TABLE_SPECS

H100 = "NVIDIA H100 80GB HBM3"  # the spec sheet's H100 SXM: int8 1978.9 TOPS, 3,350 GB/s


def _results(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    """Ok results of tinycnn (its cost is in the committed table) at batch 64: (engine, precision, latency s)."""
    return pd.DataFrame(
        [
            {
                "model": "tinycnn",
                "resolution": 32,
                "engine": engine,
                "precision": precision,
                "batch_size": 64,
                "device_name": H100,
                "status": "ok",
                "latency_median_s": latency,
            }
            for engine, precision, latency in rows
        ]
    )


def test_eight_bit_rows_count_one_byte_an_element():
    t = rfp.theoretical_vs_measured(
        results_df=_results(
            [("eager", "fp32", 1.0), ("eager", "fp16", 1.0), ("quant", "int8", 1.0), ("quant", "fp8", 1.0)]
        )
    )
    b = dict(zip(t["precision"], t["bytes_per_step"], strict=True))
    assert b["int8"] == b["fp8"] == pytest.approx(b["fp16"] / 2) == pytest.approx(b["fp32"] / 4)
    cost = model_cost("tinycnn", 32)
    assert b["int8"] == pytest.approx(cost.traffic_elements_fixed + 64 * cost.traffic_elements_per_image)


def test_a_time_below_its_bound_is_flagged_never_plain():
    cost = model_cost("tinycnn", 32)
    eager_s = cost.traffic_bytes(64, "int8") / 3350e9  # memory-bound: above FLOPs / peak
    floor_s = max(cost.flops(64) / 1978.9e12, cost.min_bytes(64, "int8") / 3350e9)
    assert floor_s < eager_s / 10
    t = rfp.theoretical_vs_measured(
        results_df=_results(
            [
                ("quant", "int8", 2 * eager_s),  # slower than the bound: a plain row
                ("quant", "int8", eager_s / 2),  # a fusing engine beats eager traffic: flagged, and why
                ("quant", "int8", floor_s / 2),  # below the floor: cannot be true
            ]
        )
    ).sort_values("measured_s", ascending=False)
    assert list(t["engine"]) == ["quant"] * 3
    assert list(t["flagged"]) == [False, True, True]
    assert list(t["flags"]) == [[], [rfp.BELOW_EAGER], [rfp.BELOW_FLOOR]]
    assert t["floor_s"].iloc[0] == pytest.approx(floor_s)
    assert t["theoretical_s"].iloc[0] == pytest.approx(eager_s)
    assert (t["measured_over_theoretical"].iloc[1:] < 1).all()  # the ratio stays, beside its flag
    # the report's table says which bytes its bound counts, and shows the flags
    title, cols = TABLE_SPECS["roofline_theory_vs_measured"]
    heads = [h for h, _ in cols]
    assert "theoretical ms (eager bytes)" in heads and "flags" in heads and "engine" in heads
    cell = dict(cols)["flags"]
    assert cell(t.iloc[1].to_dict()) == rfp.BELOW_EAGER and cell(t.iloc[0].to_dict()) == ""
