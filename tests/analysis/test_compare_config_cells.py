"""``deepgap compare``: a configuration cell names the configuration only; accuracy has its own column.

Why: a quantized row's configuration cell carried its accuracy text beneath the name ("resnet50 quant int8
… on NVIDIA H200 (cuda)" then "relL2 0.0171 (≤ 0.25), cosine …"), in the best-batch table and beside the
paper's rows, so the column that names a configuration held a measurement too.
"""

from __future__ import annotations

import pandas as pd

from deepgap.report import compare_console as cc

ACC = "relL2 0.0171 (≤ 0.25), cosine 0.9999 (≥ 0.95) vs fp32; top-1 agreement 8/8"


def _pair(precision: str, engine: str) -> dict:
    conf = f"resnet50 {engine} {precision} bs256 224px on NVIDIA H200 (cuda)"
    return {
        "model": "resnet50",
        "engine": engine,
        "precision": precision,
        "configuration_a": conf,
        "configuration_b": conf.replace("H200", "H100 80GB HBM3"),
        "accuracy_a": ACC if precision == "int8" else "relL2 0.00068 (≤ 0.02)",
        "accuracy_b": ACC if precision == "int8" else "relL2 0.00068 (≤ 0.02)",
        "throughput_ips_a": 2000.0,
        "throughput_ips_b": 1000.0,
        "speedup": 2.0,
        "speedup_ci_low": 1.9,
        "speedup_ci_high": 2.1,
        "flagged": False,
        "flags": [],
        "warnings": [],
    }


def _columns(table) -> dict[str, list[str]]:
    return {str(c.header): [str(v) for v in c.cells] for c in table.columns}


def test_best_table_keeps_accuracy_out_of_the_configuration():
    best = pd.DataFrame([_pair("int8", "quant"), _pair("fp16", "eager")])
    cols = _columns(cc.best_table(best))
    assert cols["A configuration"] == list(best["configuration_a"])  # the name, and nothing beneath it
    assert cols["B configuration"] == list(best["configuration_b"])
    assert not any("relL2" in c or "\n" in c for c in cols["A configuration"] + cols["B configuration"])
    assert cols["A accuracy (8-bit rows)"] == [ACC, ""] and cols["B accuracy (8-bit rows)"] == [ACC, ""]
    # no 8-bit row: no accuracy column, the table as it was
    plain = _columns(cc.best_table(best.iloc[[1]]))
    assert not [h for h in plain if "accuracy" in h]


def test_paper_table_keeps_accuracy_out_of_the_configuration():
    conf = "resnet50 quant int8 bs256 224px on NVIDIA H200 (cuda)"
    row = {
        "model": "resnet50",
        "precision": "int8",
        "paper_precision": "int8",
        "configuration": conf,
        "accuracy": ACC,
        "throughput_ips": 30000.0,
        "paper_platform": "NVIDIA L4",
        "paper_engine": "tensorrt",
        "paper_batch": 256,
        "paper_images_per_s": 5000.0,
        "pairing": "GPU vs GPU",
        "ratio_vs_paper": 6.0,
        "ratio_ci_low": 5.9,
        "ratio_ci_high": 6.1,
        "flags": [],
        "warnings": [],
    }
    cols = _columns(cc.paper_table(pd.DataFrame([row])))
    assert cols["your configuration"] == [conf]
    assert cols["your accuracy (8-bit rows)"] == [ACC]
