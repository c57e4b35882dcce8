"""The real-clock server agrees with the simulator fed its own calibrated curve.

The test runs ``deepgap serve``'s server scenario for real on the CPU with the tiny CNN, then checks it
against the discrete-event simulator fed the service curve that the same run calibrated, on the same
(stored) arrivals.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepgap.store import Store


@pytest.mark.slow
def test_real_server_agrees_with_the_simulator_on_its_own_curve(tmp_path):
    """Stated tolerance: mean latency within a factor 3 of the simulator's, mean batch within 50 %.

    The simulator leaves out host work between batches and jitter beyond the calibration's: on an idle
    2-core CPU the real server's mean latency came out 3–30 % above it, with other processes competing
    for the two cores 0.66–2.5×, hence the loose bound; a unit error or a curve from the wrong batch
    size is far outside it. The prediction stored with the level must be exactly the simulator's output
    for the stored arrivals and the stored curve.
    """
    for attempt in range(2):  # a stall of the shared 2-core machine (another test's processes) can put one
        # run's queue far behind; such a run is repeated once on a fresh store, with the same bound
        ratio = _one_run(str(tmp_path / f"serve{attempt}.sqlite"))
        if 1 / 3 <= ratio <= 3:
            break
    assert 1 / 3 <= ratio <= 3, ratio


def _one_run(path: str) -> float:
    """One served level and its checks against the simulator; returns measured / predicted mean latency."""
    from deepgap.serving.batcher import BatchPolicy
    from deepgap.serving.serve_run import run_serve
    from deepgap.serving.sim import ServiceModel, simulate
    from deepgap.serving.spec import ServeSpec
    from deepgap.serving.storage import curves_frame, levels_frame, requests

    policy = BatchPolicy(4, 0.0005)
    spec = ServeSpec(
        model="tinycnn",
        device="cpu",
        scenario="server",
        qps=2000.0,
        max_batch=policy.max_batch,
        max_delay_s=policy.max_delay_s,
        batch_sizes=(1, 2, 4),
        threads=1,
        min_queries=600,
        min_duration_s=0.5,
        curve_iterations=30,
        seed=3,
    )
    out = run_serve(spec, path, say=lambda m: None)
    assert out.status == "ok", out.reason
    st = Store(path, readonly=True)
    lv = levels_frame(st).iloc[-1]
    assert (lv["scenario"], lv["purpose"], lv["status"]) == ("server", "fixed", "ok")
    cf = curves_frame(st)
    assert list(cf["batch_size"]) == [1, 2, 4]
    service = ServiceModel(
        tuple(int(b) for b in cf["batch_size"]),
        tuple(cf["latency_median_s"]),
        {int(b): s for b, s in zip(cf["batch_size"], cf["samples_s"], strict=True)},
    )
    rq = requests(st, int(lv["serve_id"]))
    st.close()
    assert len(rq) == lv["n"] == 1000  # 2000 q/s × 0.5 s
    sim = simulate(rq["arrival_s"].to_numpy(), policy, service, seed=spec.seed)
    assert sim.latency_s.mean() == pytest.approx(lv["predicted_mean_s"], rel=1e-9)
    assert int(rq["batch"].max()) <= policy.max_batch
    parts = rq["queue_s"] + rq["h2d_s"] + rq["compute_s"] + rq["d2h_s"]
    assert np.all(parts <= rq["latency_s"] + 1e-9)  # the parts never exceed the latency they split
    ratio = lv["latency_mean_s"] / sim.latency_s.mean()
    if 1 / 3 <= ratio <= 3:  # the mean batch is compared only for a run that kept pace
        assert float(lv["mean_batch"]) == pytest.approx(float(sim.batch.mean()), rel=0.5)  # stored as TEXT
    return float(ratio)
