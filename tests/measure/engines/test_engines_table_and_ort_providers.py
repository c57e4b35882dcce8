"""README claims no other test pinned down: a CPU-only ORT skips GPU providers with the reason; the energy
check and the engines table read their stores; flagged rows stay beside good ones in that table."""

import importlib.util
import json
import sys

import pytest
from repo_paths import BENCHMARKS

BENCH = BENCHMARKS


def test_gpu_ort_configs_without_the_provider_are_skipped_with_the_reason():
    """A CPU-only onnxruntime asked for a GPU provider says so (as on the H100 machine), never falls back."""
    pytest.importorskip("onnxruntime")
    from deepgap.core.precision import DeviceCaps
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine
    from deepgap.measure.engines.ort import providers_available

    caps = DeviceCaps("cuda:0", "cuda", "Some GPU", (9, 0))
    have = providers_available()
    checked = 0
    for engine, provider, precision in (
        ("onnxruntime", "CUDAExecutionProvider", "fp16"),
        ("onnxruntime-trt", "TensorrtExecutionProvider", "int8"),
    ):
        if provider in have:
            continue
        spec = ConfigSpec(
            model="tinycnn", engine=engine, precision=precision, batch_size=1, device="cuda:0", resolution=32
        )
        e = get_engine(engine)
        why = e.available() or e.supports(spec, caps)
        assert why.startswith(f"unavailable: the installed onnxruntime has no {provider}"), why
        assert "onnxruntime-gpu" in why
        checked += 1
    if not checked:
        pytest.skip("this onnxruntime has the GPU providers")


@pytest.mark.slow
def test_energy_check_selftest_and_engines_table_from_its_store(
    tmp_path, monkeypatch, capsys, inprocess_runs
):
    """energy_check.py --selftest passes on fake telemetry; engines.py reads the store it wrote.

    The script's ``main()`` runs in this process, as ``python energy_check.py ARGS`` would run it: a fresh
    interpreter imported torch and started a fork server of its own (~7 s of CPU on two cores) only to
    run what this test checks, the script's sweep, files and verdict. Its sweep measures in this process
    too (`inprocess_runs`): the worker's isolation is tests/drive/test_runner.py's, and a real worker first
    waited ~30 s on two cores for a fork server importing torch.
    """
    store, out = tmp_path / "s.sqlite", tmp_path / "ec.json"
    mod_spec = importlib.util.spec_from_file_location("deepgap_bench_energy_check", BENCH / "energy_check.py")
    energy_check = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(energy_check)
    argv = ["energy_check.py", "--selftest", "--store", str(store), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(tmp_path)
    rc = energy_check.main()
    assert rc == 0, capsys.readouterr().out[-2000:]
    report = json.loads(out.read_text())
    assert report["pass"] and len(report["configs"]) == 2
    for c in report["configs"]:
        assert abs(c["ratio"] - 1) <= 0.05 and c["tail_j"] >= 0
        assert c["deepgap_energy_j"] == pytest.approx(c["deepgap_raw_counter_j"] - c["tail_j"], rel=1e-9)
        assert c["idle_power_w"] == pytest.approx(100.0, rel=0.05)  # the fake device draws 100 W
        assert c["joules_per_image"] * c["ips_per_watt_energy"] == pytest.approx(1.0)
    mod_spec = importlib.util.spec_from_file_location("deepgap_bench_engines", BENCH / "engines.py")
    engines = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(engines)  # what `engines.py --from-store STORE --model tinycnn` prints
    (row,) = engines.table(str(store), "tinycnn")
    assert (row["engine"], row["precision"]) == ("eager", "fp32") and row["best_batch"] in (8, 64)
    assert row["best_ips"] > 0 and row["bs1_ms"] is None  # no batch-1 configuration in the self-test
    assert "| eager | nchw | fp32 |" in engines.render([row])


def test_engines_table_note_keeps_good_rows_beside_flagged_ones():
    mod_spec = importlib.util.spec_from_file_location("deepgap_bench_engines", BENCH / "engines.py")
    engines = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(engines)
    assert engines.note([], 2, 0) == ""
    assert engines.note([], 2, 2) == "2 flagged measurement(s) excluded"  # re-measured after a fix
    assert engines.note([], 0, 2) == "output flagged vs fp32"
    assert engines.note(["out of memory"], 0, 0) == "out of memory"
