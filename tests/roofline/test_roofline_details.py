"""`ProfileDetails` reads and writes exactly the ``extra_json`` the committed roofline stores hold.

Every committed profile's details go through ``from_json`` and back: the same JSON object, and with
the store's serialization the same text byte for byte. The profiles are read from slices
(``committed_slices``) of ``results/h100/roofline.sqlite`` (six profiles, infer and train, schema 1) and
``results/h100/session8/session-kinds.sqlite`` (one profile beside peaks and serve runs, schema 3) with
every profile row kept and the per-kernel and per-request rows dropped: representative because the
details are a column of the profile rows, which the slices hold as the runs wrote them.
(``results/h200/roofline.sqlite`` holds peaks only, no profile, so it had nothing to round-trip.)

Unknown keys survive, a producer-built record writes the keys `run_profile` always wrote
(``busy_fraction`` null on a CPU, nothing for a failed profile), and a `ProfileResult` survives the
pickling between the worker and the CLI.
"""

import json
import math
import pickle
from pathlib import Path

import pytest
from committed_slices import unpacked

from deepgap.roofline import storage
from deepgap.roofline.details import ProfileDetails
from deepgap.roofline.profile import ProfileResult, ProfileSpec
from deepgap.store import Store
from deepgap.store.schema import ROOFLINE_PROFILES

COMMITTED = ["h100_roofline", "h100_session8_session_kinds"]
KEYS = [
    "profiled_ops_per_step",
    "counted_flops_per_step",
    "busy_fraction",
    "unattributed_kernel_time_s",
    "step_time_mean_s",
    "step_time_min_s",
    "torch",
]


def _committed_profiles(name: str, tmp_path: Path):
    store = Store(str(unpacked(name, tmp_path)), readonly=True, redact=False)
    try:
        raw = store.table_frame(ROOFLINE_PROFILES, order=["profile_id"])
        frame = storage.profiles_frame(store)
    finally:
        store.close()
    return list(raw["extra_json"]), frame


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_details_round_trip(name, tmp_path):
    texts, frame = _committed_profiles(name, tmp_path)
    assert len(frame) == len(texts) > 0
    for text in texts:
        parsed = json.loads(text)
        details = ProfileDetails.from_json(parsed)
        assert details.to_json() == parsed and list(details.to_json()) == list(parsed)
        assert json.dumps(details.to_json(), default=str) == text  # what `record_profile` writes
        assert not details.other  # every key the committed stores hold is declared
    for d, text in zip(frame["extra"], texts, strict=True):
        assert isinstance(d, ProfileDetails) and d.to_json() == json.loads(text)


def test_the_committed_stores_hold_measured_profiles(tmp_path):
    """The round trip above is not vacuous: some committed profiles carry every key, busy_fraction set."""
    found = []
    for name in COMMITTED:
        found += [json.loads(t) for t in _committed_profiles(name, tmp_path)[0]]
    full = [d for d in found if list(d) == KEYS]
    assert full and all(ProfileDetails.from_json(d).busy_fraction == d["busy_fraction"] for d in full)


def test_unknown_keys_survive():
    raw = {"torch": "2.5.0", "from_the_future": {"a": [1, 2]}, "busy_fraction": None, "ncu_passes": 3}
    d = ProfileDetails.from_json(raw)
    assert d.to_json() == raw and list(d.to_json()) == list(raw)
    assert d.other == {"from_the_future": {"a": [1, 2]}, "ncu_passes": 3} and d.torch == "2.5.0"
    assert d.get("ncu_passes") == 3 and ProfileDetails.from_json({}).to_json() == {}


def _measured(busy):
    return ProfileDetails(
        profiled_ops_per_step=90.0,
        counted_flops_per_step=2.3e11,
        busy_fraction=busy,
        unattributed_kernel_time_s=0.0,
        step_time_mean_s=0.0027,
        step_time_min_s=0.0026,
        torch="2.5.0",
    )


def test_producer_writes_what_it_always_wrote():
    gpu = _measured(0.9).to_json()
    assert list(gpu) == KEYS and gpu["busy_fraction"] == 0.9
    cpu = _measured(None).to_json()
    assert list(cpu) == KEYS and cpu["busy_fraction"] is None  # a CPU profile wrote null, not nothing
    assert ProfileDetails().to_json() == {}  # a failed profile wrote no details


def test_record_and_read_back(tmp_path):
    """A profile recorded through the store keeps its details (and pickles, as the worker returns it)."""
    res = ProfileResult(
        spec=ProfileSpec(model="resnet18"),
        status="ok",
        resolution=224,
        step_times_s=[0.0026, 0.0028],
        details=_measured(None),
    )
    res = pickle.loads(pickle.dumps(res))
    assert isinstance(res.details, ProfileDetails) and res.details == _measured(None)
    failed = ProfileResult(spec=ProfileSpec(model="resnet18"), status="error", reason="boom")
    store = Store(str(tmp_path / "s.sqlite"))
    try:
        run = store.begin_run({}, "test", {"device_name": "cpu"}, "0", kind="profile")
        storage.record_profile(store, run, res)
        storage.record_profile(store, run, failed)
        texts = list(store.table_frame(ROOFLINE_PROFILES, order=["profile_id"])["extra_json"])
        frame = storage.profiles_frame(store)
    finally:
        store.close()
    assert texts == [json.dumps(_measured(None).to_json()), "{}"]
    got, none = frame["extra"]
    assert got.to_json() == _measured(None).to_json() and got.busy_fraction is None
    assert none.to_json() == {} and not math.isnan(got.step_time_mean_s)


def test_run_profile_builds_the_details_on_a_cpu():
    """The producer itself: a measured CPU profile writes every key, ``busy_fraction`` null."""
    from deepgap.roofline.profile_measure import run_profile

    res = run_profile(ProfileSpec("resnet18", "fp32", 1, "infer", "cpu", 32, warmup=0, steps=2))
    assert res.status == "ok", res.reason
    out = res.details.to_json()
    assert list(out) == KEYS and out["busy_fraction"] is None and out["profiled_ops_per_step"] > 0
    assert out["step_time_min_s"] == min(res.step_times_s)
