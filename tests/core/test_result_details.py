"""`ResultDetails` reads and writes exactly the ``extra_json`` the committed stores hold.

Every shape of details the committed stores hold goes through ``from_json`` and back: the same JSON
object, and with the store's serialization the same text byte for byte (key order and nulls included).
The stores read are slices (``committed_slices``) of ``results/h100/default.sqlite`` and of the
``results/h100/session8/`` stores with results, each keeping one result per distinct shape of its
``extra_json`` (keys in order, value types, escaped strings), in its own schema version (1 or 3); they
are representative because a round trip depends on that shape, not on the numbers, and the stores left
out (``quant-fused-stem``, ``recheck``) hold no shape the others lack. A schema-3 store with runs and no
results (``session-kinds``) reads as empty. Unknown keys survive a round trip, the typed fields are what
the consumers read, and a result recorded and read back through the store keeps its details.
"""

import dataclasses
import json

import pytest
from committed_slices import unpacked

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import (
    Accuracy,
    Correctness,
    DeviceMemUsed,
    EngineInfo,
    MemoryPeaks,
    ResultDetails,
    TelemetryDetails,
    Window,
)
from deepgap.store import Store

COMMITTED = [
    "h100_default",
    "h100_session8_accuracy",
    "h100_session8_nvml_access",
    "h100_session8_quant_fused_stem_rows",
    "h100_session8_quant_fused_stem_v1",
    "h100_session8_quant_stem_padding",
    "h100_session8_quant",
    "h100_session8_session_kinds",
]


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_details_round_trip(name, tmp_path):
    store = Store(str(unpacked(name, tmp_path)), readonly=True, redact=False)
    try:
        texts = store.extra_json()
        frame = store.results_frame()
    finally:
        store.close()
    assert len(frame) == len(texts) and (texts or name == "h100_session8_session_kinds")  # runs only
    for rid, text in texts.items():
        parsed = json.loads(text)
        details = ResultDetails.from_json(parsed)
        assert details.to_json() == parsed, rid
        assert json.dumps(details.to_json(), default=str) == text, rid  # what `Store.record` writes
    for rid, d in zip(frame["result_id"], frame["extra"], strict=True):
        assert isinstance(d, ResultDetails) and d.to_json() == json.loads(texts[int(rid)])


def test_unknown_keys_survive():
    raw = {
        "setup_s": 1.5,
        "from_the_future": {"a": [1, 2]},
        "engine_info": {"compile_s": 3.0, "stem": {"backend": "cudnn"}, "graphs": 1},
        "correctness": {"flagged": False, "new_metric": 0.5},
        "telemetry": "not an object",
        "flags": "foreign-process",
    }
    d = ResultDetails.from_json(raw)
    assert d.to_json() == raw and list(d.to_json()) == list(raw)
    assert d.other == {"from_the_future": {"a": [1, 2]}, "telemetry": "not an object"}
    assert d.telemetry is None  # a value of the wrong shape is kept, not typed
    assert d.engine_info.compile_s == 3.0 and d.engine_info.get("stem") == {"backend": "cudnn"}
    assert d.correctness.other == {"new_metric": 0.5}
    # a producer's change to a read record is written in the key's place
    d.engine_info.compile_s = 4.0
    assert d.to_json()["engine_info"] == {"compile_s": 4.0, "stem": {"backend": "cudnn"}, "graphs": 1}


def test_nulls_read_are_written_back():
    raw = {"windows": [], "ci_halfwidth_rel": None, "device_mem_used": {"final_bytes": None}}
    assert ResultDetails.from_json(raw).to_json() == raw


def test_typed_access():
    d = ResultDetails.from_json(
        {
            "correctness": {
                "rel_l2": 0.01,
                "cosine": 0.999,
                "top1_agreement": 1.0,
                "top5_overlap": 1.0,
                "n_images": 8,
                "bound_rel_l2": 0.02,
                "flagged": False,
            },
            "windows": [{"iterations": 10, "seconds": 0.5}],
            "telemetry": {
                "backend": "nvml",
                "status": "ok",
                "joules_per_image": 0.2,
                "max_device_mem_used_bytes": 7,
            },
            "prepare_peak_mem_bytes": {"allocated": 1, "reserved": 2},
            "accuracy": {"top1": 0.76, "top1_relative": 0.99},
            "node_env": {"host": "h"},
        }
    )
    assert isinstance(d.correctness, Correctness)
    assert d.correctness.rel_l2 == 0.01 and d.correctness.flagged is False
    assert d.windows == [Window(iterations=10, seconds=0.5)]
    assert isinstance(d.telemetry, TelemetryDetails) and d.telemetry.max_device_mem_used_bytes == 7
    assert d.prepare_peak_mem_bytes == MemoryPeaks(allocated=1, reserved=2)
    assert isinstance(d.accuracy, Accuracy) and d.accuracy.top1_relative == 0.99
    assert d.node_env == {"host": "h"} and d.engine_info is None and d.traceback is None
    assert ResultDetails.of(None) == ResultDetails() and ResultDetails.of(d) is d


def test_producer_order_and_always_written_keys():
    """Built the way the worker builds it, the JSON has the committed stores' key order and nulls."""
    d = ResultDetails(
        setup_s=0.1,
        engine_info=EngineInfo.from_json({"capture_s": 0.2}),
        correctness=Correctness(flagged=False),
        windows=[Window(iterations=3, seconds=0.3)],
        torch_threads=4,
    )  # ci_halfwidth_rel None: written with the windows
    d.device_mem_used = DeviceMemUsed(final_bytes=5, sampled_max_bytes=None)
    d.prepare_peak_mem_bytes = MemoryPeaks(allocated=1, reserved=2)
    d.telemetry = TelemetryDetails.from_json({"status": "off", "backend": "none"})
    d.flags = ["clocks-low"]
    assert json.dumps(d.to_json()) == json.dumps(
        {
            "setup_s": 0.1,
            "engine_info": {"capture_s": 0.2},
            "correctness": {"flagged": False},
            "windows": [{"iterations": 3, "seconds": 0.3}],
            "ci_halfwidth_rel": None,
            "torch_threads": 4,
            "telemetry": {"status": "off", "backend": "none"},
            "flags": ["clocks-low"],
            "prepare_peak_mem_bytes": {"allocated": 1, "reserved": 2},
            "device_mem_used": {"final_bytes": 5, "sampled_max_bytes": None},
        }
    )
    assert ResultDetails().to_json() == {} and ResultDetails(traceback="tb").to_json() == {"traceback": "tb"}


def test_details_declare_every_producer_field():
    """The producers' records and the typed details name the same keys (core cannot import measure:
    telemetry's both derive from `TelemetryKeys`, the output check's are declared twice)."""
    from deepgap.measure.correctness import Agreement
    from deepgap.measure.telemetry.base import TelemetryWindow

    missing = {f.name for f in dataclasses.fields(TelemetryWindow)} - set(TelemetryDetails.declared())
    assert not missing, missing
    assert [f.name for f in dataclasses.fields(Agreement)] == list(Correctness.declared())


def test_store_round_trip(tmp_path):
    store = Store(str(tmp_path / "s.sqlite"))
    try:
        run = store.begin_run({}, "test", {"device_name": "cpu"}, "0")
        spec = ConfigSpec("resnet18", "eager", "fp32", 1, "cpu")
        details = ResultDetails(
            setup_s=0.5, correctness=Correctness(flagged=True, rel_l2=0.3), other={"kept": 1}
        )
        store.record(run, Result(spec=spec, status=Status.OK, details=details))
        (text,) = store.extra_json().values()
        (read,) = store.results_frame()["extra"]
    finally:
        store.close()
    assert text == json.dumps(details.to_json()) and read.to_json() == details.to_json()
    assert read.correctness.flagged is True and read.other == {"kept": 1}
