"""A served level's tail is a p99 only where its requests support one (n ≥ 368), else their max, named.

Before: `show` and the report headed every level's tail "p99 ms", and a capacity probe that stopped after
348 requests showed a "p99" of 348 (the top samples interpolated) beside the simulator's p99.
"""

from __future__ import annotations

import math

import pandas as pd

from deepgap.serving.show.tables import add_tails, sim_p99, tail_text


def _levels() -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "n": [348, 4191, None],
            "latency_p99_s": [0.025210, 0.006128, math.nan],
            "latency_max_s": [0.031000, 0.009000, math.nan],
            "predicted_p99_s": [0.015925, 0.003451, math.nan],
        }
    )
    add_tails(df)
    return df


def test_the_tail_is_a_max_below_368_requests_and_a_p99_from_there():
    rows = _levels().to_dict("records")
    assert tail_text(rows[0]) == "31.000 (max of n=348)"  # the max, not the interpolated "p99" of 25.210
    assert tail_text(rows[1]) == "6.128 (p99 of n=4191)"
    assert tail_text(rows[2]) == ""  # nothing measured: a blank, not a number


def test_the_simulators_p99_stands_only_beside_a_measured_p99():
    rows = _levels().to_dict("records")
    assert sim_p99(rows[0]) is None and sim_p99(rows[1]) == 0.003451


def test_show_heads_the_column_tail(tmp_path):
    from deepgap.serving.show.console import LEVELS, TEXT

    for columns in (LEVELS, TEXT):
        headers = [h for h, _ in columns]
        assert "tail ms" in headers and "p99 ms" not in headers, headers


def test_console_lines_name_the_tail_by_its_n():
    from dataclasses import fields

    from deepgap.serving.sim.log import LevelSummary

    nums = {f.name: 0.0 for f in fields(LevelSummary) if f.type in ("float", "float | None")}
    few = LevelSummary(
        **{**nums, "n": 348, "n_planned": 1000, "latency_p99_s": 0.02521, "latency_max_s": 0.031}
    )
    assert few.tail_words() == "max 31.000 ms (n=348, too few for a p99)"
    many = LevelSummary(
        **{**nums, "n": 4191, "n_planned": 4191, "latency_p99_s": 0.006128, "latency_max_s": 0.009}
    )
    assert many.tail_words() == "p99 6.128 ms"


def test_the_tenants_matrix_names_a_max_and_keeps_its_ratio_to_p99s():
    from deepgap.serving.run.tenants import interference_lines

    m = {
        "a": {"alone": {"p99_s": 0.005, "max_s": 0.009, "n": 1000, "achieved_qps": 100.0},
              "a+b": {"p99_s": 0.010, "max_s": 0.020, "n": 200, "achieved_qps": 90.0}},
        "b": {"alone": {"p99_s": 0.004, "max_s": 0.006, "n": 500, "achieved_qps": 80.0},
              "a+b": {"p99_s": 0.008, "max_s": 0.010, "n": 600, "achieved_qps": 70.0}},
    }  # fmt: skip
    head, _, a, b = interference_lines(m)
    assert "p99 where n ≥ 368, else max" in head
    assert "max 20.00 / 90" in a and "×" not in a  # 200 requests: their max, and no p99 ratio
    assert a.split()[1] == "5.00" and "8.00 / 70 2.00×" in b


def test_the_simulator_figure_says_its_levels_were_too_short_for_a_p99():
    """It said "no level with a prediction" beside a level that had one, of 348 requests."""
    from deepgap.serving.show.report_section import predicted_vs_measured

    lv = _levels().iloc[[0]].assign(status="ok", scenario="server")
    fig = predicted_vs_measured(lv)
    assert "no level of at least 368 requests (1 predicted level(s) had fewer" in fig.unavailable
    assert predicted_vs_measured(lv.assign(predicted_p99_s=math.nan)).unavailable.endswith(
        "no level with a prediction in these runs"
    )
    assert predicted_vs_measured(_levels().assign(status="ok", scenario="server")).unavailable is None
