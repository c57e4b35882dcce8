"""benchmarks/llm_decode.py (issue 51) runs end to end on the CPU with the tiny decoder and writes its files.

What a later GPU session runs with the 1B/8B shapes is this script; here it is checked on tiny lengths
(milliseconds): one JSON with the environment and the shape, one CSV row per batch, the roofline
columns when a bandwidth is given, and the static step's tokens equal to the eager step's.
"""

import csv
import importlib.util
import json

from repo_paths import BENCHMARKS

SCRIPT = BENCHMARKS / "llm_decode.py"


def _script():
    spec = importlib.util.spec_from_file_location("llm_decode", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_run_writes_json_and_csv(tmp_path):
    argv = ["--model", "llama-tiny", "--device", "cpu", "--batches", "1,2", "--input-len", "4"]
    argv += ["--output-len", "3", "--repeats", "1", "--step", "static", "--bandwidth-gbs", "10"]
    assert _script().main([*argv, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "llm_decode.json").read_text())
    assert data["env"]["device"] == "cpu" and data["env"]["shape"]["hidden"] == 64
    rows = list(csv.DictReader((tmp_path / "llm_decode.csv").open()))
    assert [int(r["batch"]) for r in rows] == [1, 2]
    for r in rows:
        assert float(r["token_agreement_with_eager"]) == 1.0
        assert int(r["tpot_n"]) == 2 and r["tpot_tail_kind"] == "max"
        assert float(r["decode_bound_tok_s"]) > 0 and r["dtype"] == "torch.float32"
