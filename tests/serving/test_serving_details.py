"""The serving tables' typed details read and write exactly the ``extra_json`` the committed stores hold.

Every serving row of three committed serve stores (read through the store and
`deepgap.serving.records.storage`) goes through ``from_json`` and back: the same JSON object, and with the
store's serialization the same text byte for byte. The stores are slices (``committed_slices``) of
``results/h100/serving.sqlite.gz``, ``results/h100/session6/serving-int8.sqlite.gz`` and
``results/h100/session10/serve.sqlite.gz`` that keep every ``serve_runs``, ``capacity`` and
``serve_curves`` row and only the first 50 requests of each level (``serve_requests``, nearly all the
bytes, carry no details; the report's latency figure still has lines to draw): every row under test is
there, as the runs wrote it, and the report section's tables equal the full stores'. Unknown keys
survive a round trip, and the writers (`curve_rows`, `level_row`, `record`) store the JSON they always stored.
"""

import json

import numpy as np
import pytest
from committed_slices import unpacked

from deepgap.core.result_details import Correctness, EngineInfo
from deepgap.serving.records.details import CapacityDetails, CapacityProbe, CurveDetails, LevelDetails
from deepgap.serving.records.storage import ServeRecord, capacity_frame, curves_frame, levels_frame, record
from deepgap.serving.run.process import SetupReply, SetupRequest
from deepgap.serving.run.rows import curve_rows, level_row
from deepgap.serving.sim.log import LevelSummary
from deepgap.store import Store

COMMITTED = ["h100_serving", "h100_session6_serving_int8", "h100_session10_serve"]
TABLES = {
    "serve_runs": (levels_frame, LevelDetails, ["serve_id"]),
    "capacity": (capacity_frame, CapacityDetails, ["capacity_id"]),
    "serve_curves": (curves_frame, CurveDetails, ["run_id", "tenant", "batch_size"]),
}


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_serving_details_round_trip(name, tmp_path):
    copy = unpacked(name, tmp_path)
    store = Store(str(copy), readonly=True, redact=False)
    try:
        n = 0
        for table, (frame_of, cls, order) in TABLES.items():
            texts = list(store.table_frame(table, None, order)["extra_json"])
            frame = frame_of(store)
            assert len(frame) == len(texts)
            for text, d in zip(texts, frame["extra"], strict=True):
                parsed = json.loads(text)
                assert cls.from_json(parsed).to_json() == parsed
                assert isinstance(d, cls) and d.to_json() == parsed
                assert json.dumps(d.to_json(), default=str) == text  # what the store writes
                n += 1
    finally:
        store.close()
    assert n > 0


def test_committed_fields_are_typed(tmp_path):
    copy = unpacked(COMMITTED[1], tmp_path)
    store = Store(str(copy), readonly=True, redact=False)
    try:
        lv, cf, cv = levels_frame(store), capacity_frame(store), curves_frame(store)
    finally:
        store.close()
    d = lv["extra"].iloc[0]
    assert isinstance(d.correctness, Correctness) and isinstance(d.engine_info, EngineInfo)
    assert d.n_dropped is not None and d.host_mean_s is not None and d.other == {}
    assert any(e.loadgen is not None for e in lv["extra"])
    caps = list(cf["extra"])
    assert all(isinstance(p, CapacityProbe) for c in caps for p in c.probes)
    assert {c.verified for c in caps} >= {True, False}
    assert all(c.includes and c.interval_s is not None and c.other == {} for c in cv["extra"])


def test_unknown_keys_survive():
    raw = {
        "future": 1,
        "n_dropped": 2,
        "correctness": {"rel_l2": 0.1, "new": [1]},
        "engine_info": {"serving_depth": 2, "input": "uint8"},
        "notes": [],
    }
    d = LevelDetails.from_json(raw)
    assert d.to_json() == raw and list(d.to_json()) == list(raw)
    assert d.other == {"future": 1} and d.correctness.other == {"new": [1]}
    assert d.engine_info.get("serving_depth") == 2
    cap = {
        "probes": [{"rate_qps": 1.0, "verdict": "pass", "n": 5, "p99_s": None, "n_over_slo": 0, "x": 9}],
        "verified": False,
        "later": "kept",
    }
    c = CapacityDetails.from_json(cap)
    assert c.to_json() == cap and c.probes[0].other == {"x": 9} and c.other == {"later": "kept"}
    curve = {"engine_s": 0.5, "includes": "all", "host_s": None, "new": True}
    assert CurveDetails.from_json(curve).to_json() == curve
    assert list(CurveDetails.from_json(curve).to_json()) == list(curve)
    for cls in (CurveDetails, LevelDetails, CapacityDetails):
        assert cls.of(None).to_json() == {} and cls.of({}).to_json() == {}


def _summary(**kw):
    base = dict(
        n=10,
        n_planned=10,
        offered_qps=100.0,
        achieved_qps=99.0,
        duration_s=0.1,
        latency_mean_s=1e-3,
        latency_p50_s=1e-3,
        latency_p90_s=2e-3,
        latency_p95_s=2e-3,
        latency_p99_s=3e-3,
        latency_max_s=4e-3,
        queue_mean_s=0.0,
        queue_p99_s=0.0,
        h2d_mean_s=0.0,
        compute_mean_s=1e-3,
        d2h_mean_s=0.0,
        other_mean_s=0.0,
        mean_batch=1.0,
        slo_s=0.01,
        n_dropped=1,
        host_mean_s=5e-4,
        n_over_slo=0,
        verdict="pass",
    )
    return LevelSummary(**{**base, **kw})


def test_writers_store_the_json_they_always_stored(tmp_path):
    req = SetupRequest(
        model="m",
        engine="eager",
        precision="fp32",
        memory_format="channels_last",
        resolution=8,
        device="cpu",
        buckets=(1, 2),
        threads=3,
    )
    reply = SetupReply(
        caps=None,
        env={},
        buckets=(1, 2),
        curve_samples_s={1: [1e-3, 2e-3], 2: [3e-3]},
        curve_parts_s={1: {"h2d_s": 1e-4, "host_s": 2e-4, "interval_s": 3e-4, "engine_s": 4e-4}, 2: {}},
        correctness={},
        engine_info={},
        setup_s=1.0,
    )
    curves = curve_rows(reply, req)
    lg = level_row(
        req,
        "server",
        "loadgen",
        None,
        5.0,
        "loadgen",
        0,
        _summary(),
        None,
        details=LevelDetails(loadgen_summary="text", loadgen={"Result is": "VALID"}),
    )
    lv = level_row(req, "server", "measure", None, 5.0, "poisson", 0, _summary(), _summary(verdict="fail"))
    lv.details.correctness = Correctness.from_json({"rel_l2": 0.0, "flagged": False})
    lv.details.notes, lv.details.engine_info = [], EngineInfo.from_json({"serving_depth": 1})
    setup = level_row(req, "server", "setup", None, None, "", 0, None, status="error", reason="boom")
    probe = CapacityProbe(rate_qps=5.0, verdict="fail", n=3, p99_s=0.5, n_over_slo=None)
    cap = {
        "tenant": "",
        "source": "simulated",
        "model": "m",
        "engine": "eager",
        "precision": "fp32",
        "device": "cpu",
        "memory_format": "channels_last",
        "resolution": 8,
        "slo_s": 0.01,
        "details": CapacityDetails(probes=[probe], verified=False),
    }
    store = Store(str(tmp_path / "s.sqlite"))
    try:
        run = store.begin_run({}, "test", {"device_name": "cpu"}, "0", kind="serve")
        rec = ServeRecord({}, "test", {}, levels=[lg, lv, setup], curves=curves, capacities=[cap])
        record(store, run, rec)
        levels = list(store.table_frame("serve_runs", None, ["serve_id"])["extra_json"])
        caps = list(store.table_frame("capacity", None, ["capacity_id"])["extra_json"])
        cvs = list(store.table_frame("serve_curves", None, ["run_id", "batch_size"])["extra_json"])
        cf = curves_frame(store)
    finally:
        store.close()
    assert [json.loads(t) for t in levels] == [
        {
            "threads": 3,
            "loadgen_summary": "text",
            "loadgen": {"Result is": "VALID"},
            "n_dropped": 1,
            "host_mean_s": 5e-4,
        },
        {
            "threads": 3,
            "n_dropped": 1,
            "host_mean_s": 5e-4,
            "predicted_verdict": "fail",
            "correctness": {"rel_l2": 0.0, "flagged": False},
            "notes": [],
            "engine_info": {"serving_depth": 1},
        },
        {"threads": 3},
    ]
    assert list(json.loads(levels[1])) == [
        "threads",
        "n_dropped",
        "host_mean_s",
        "predicted_verdict",
        "correctness",
        "notes",
        "engine_info",
    ]
    probes = [{"rate_qps": 5.0, "verdict": "fail", "n": 3, "p99_s": 0.5, "n_over_slo": None}]
    assert [json.loads(t) for t in caps] == [{"probes": probes, "verified": False}]
    includes = "issue, h2d (uint8), normalise + compute, d2h, sync"
    assert [json.loads(t) for t in cvs] == [
        {"includes": includes, "host_s": 2e-4, "interval_s": 3e-4, "engine_s": 4e-4},
        {"includes": includes},
    ]
    assert np.allclose(cf["samples_s"].iloc[0], [1e-3, 2e-3]) and cf["extra"].iloc[0].interval_s == 3e-4


def test_report_table_keeps_the_stored_json(tmp_path):
    """The report's capacity table (and so its CSV) holds the stored JSON objects, not the records."""
    from deepgap.serving.show.report_section import section

    copy = unpacked(COMMITTED[1], tmp_path)
    found, _ = section(str(copy))
    cap = found["serving_capacity"]
    store = Store(str(copy), readonly=True, redact=False)
    try:
        stored = {
            int(i): json.loads(t)
            for i, t in store.table_frame("capacity", None, ["capacity_id"])[
                ["capacity_id", "extra_json"]
            ].values
        }
    finally:
        store.close()
    assert len(cap) and all(isinstance(e, dict) for e in cap["extra"])
    assert all(e == stored[int(i)] for i, e in zip(cap["capacity_id"], cap["extra"], strict=True))


def test_simulated_rows_mark_the_measured_policies_verified_and_label_the_rest():
    """`simulated_rows`, the one marking of both searches' simulated rows (images' and decoders')."""
    from types import SimpleNamespace

    from deepgap.serving.run.rows import simulated_rows

    ranked = [SimpleNamespace(policy=p, capacity_qps=q) for p, q in (("a", 9.0), ("b", 7.0))]
    rows = simulated_rows(
        ranked,
        [SimpleNamespace(policy="a")],
        lambda r, p: {"note": "" if r.policy == "a" else "slow", "qps": p, "details": CapacityDetails()},
    )
    assert [(r["qps"], r["details"].verified, r["note"]) for r in rows] == [
        (9.0, True, ""),
        (7.0, False, "unverified (simulated only); slow"),
    ]
