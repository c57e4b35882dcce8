"""The answer's throughput line carries the back-to-back figure beside the synchronized headline.

Why: at a power cap the two part (session 27, one H200: ResNet-50 fp8 at 1024, 58,458 img/s from the median
synchronized latency, 57,063 back to back), and a user who keeps a server full plans with the second.
"""

from __future__ import annotations

from deepgap.report.answer import _numbers

ROW = {
    "throughput_ips": 58_458.0,
    "throughput_ci_low_ips": 58_300.0,
    "throughput_ci_high_ips": 58_600.0,
    "latency_median_s": 1024 / 58_458.0,
    "latency_max_s": 0.0179,
    "n_samples": 20,
}


def test_throughput_names_the_back_to_back_figure_beside_the_headline():
    value, _, also = _numbers({**ROW, "throughput_pipelined_ips": 57_063.0}, "throughput")
    assert value == "58,458.0 img/s"
    assert also.startswith("median 17.5") and also.endswith("back to back 57,063.0 img/s")


def test_no_back_to_back_figure_where_none_was_measured():
    for missing in (None, float("nan")):
        _, _, also = _numbers({**ROW, "throughput_pipelined_ips": missing}, "throughput")
        assert "back to back" not in also
