"""The report says per run whether thermal steady state was reached, and counts rows measured warming."""

import pandas as pd

from deepgap.analysis.thermal import thermal_state


def _tel(summary):
    row = {"run_id": "r", "result_id": None, "phase": "thermal-summary", "t_s": 0.0, **summary}
    return pd.DataFrame([row])


def test_steady_not_reached_and_off():
    runs = [{"run_id": r, "env": {"device_name": "GPU"}} for r in ("a", "b", "c")]
    tel = {
        "a": _tel(
            {"status": "ok", "steady": True, "duration_s": 81.0, "temp_start_c": 37.0, "temp_end_c": 62.0}
        ),
        "b": _tel(
            {
                "status": "ok",
                "steady": False,
                "duration_s": 120.0,
                "timeout_s": 120.0,
                "slope_c_per_min": 2.5,
                "temp_start_c": 30.0,
                "temp_end_c": 55.0,
            }
        ),
        "c": pd.DataFrame(),
    }
    df = pd.DataFrame(
        [
            {"run_id": "a", "status": "ok", "extra": {"flags": ["temp-rising"]}},
            {"run_id": "a", "status": "ok", "extra": {"flags": []}},
            {"run_id": "b", "status": "ok", "extra": {"flags": ["temp-rising", "ci-not-met"]}},
            {"run_id": "b", "status": "oom", "extra": {"flags": ["temp-rising"]}},
            {"run_id": "c", "status": "ok", "extra": {}},
        ]
    )
    t = thermal_state(runs, tel, df).set_index("run_id")
    assert t.loc["a", "warm_up"] == "steady after 81 s, 37 → 62 °C" and t.loc["a", "steady"]
    assert t.loc["a", "measurements"] == 2 and t.loc["a", "temp_rising"] == 1
    assert t.loc["b", "warm_up"].startswith("NOT reached: stopped at the 120 s limit, still +2.50 °C/min")
    assert not t.loc["b", "steady"] and t.loc["b", "measurements"] == 1 and t.loc["b", "temp_rising"] == 1
    assert t.loc["c", "warm_up"].startswith("off") and t.loc["c", "temp_rising"] == 0
