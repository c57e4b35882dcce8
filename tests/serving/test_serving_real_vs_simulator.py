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
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_real_server_agrees_with_the_simulator_on_its_own_curve(tmp_path, device):
    """Stated tolerance (on the GPU): mean latency within a factor 3 of the simulator's, mean batch within 50 %.

    The simulator leaves out host work between batches and jitter beyond the calibration's: on an idle
    2-core CPU the real server's mean latency came out 3–30 % above it, with other processes competing
    for the two cores 0.66–2.5×, and 10.9× and 62× on a loaded CI host. So the real-clock bound is held on
    the GPU machine only (a unit error or a curve from the wrong batch size is far outside it); on the CPU
    the run checks everything that does not depend on the host's load — the stored prediction is exactly
    the simulator's output for the stored arrivals and the stored curve — and the comparison itself is
    checked on a virtual clock (test_the_comparison_on_a_virtual_clock_of_known_service_time).
    """
    if device == "cuda":
        for attempt in range(2):  # one repeat on a fresh store, with the same bound
            ratio = _one_run(str(tmp_path / f"serve{attempt}.sqlite"), device)
            if 1 / 3 <= ratio <= 3:
                break
        assert 1 / 3 <= ratio <= 3, ratio
    else:
        ratio = _one_run(str(tmp_path / "serve.sqlite"), device)
        assert np.isfinite(ratio) and ratio > 0  # a real-clock number: its bound is the GPU test's


def test_the_comparison_on_a_virtual_clock_of_known_service_time():
    """The real server's loop (`serve_loop` with a plain executor, as the CPU server runs it) on a virtual clock,
    serving a server of known service time, against the simulator fed that curve: the measured/predicted
    ratio the test above bounds is 1 here, and the mean batch agrees; a curve in ms read as s is far outside."""
    from deepgap.serving.sim import arrivals as arr
    from deepgap.serving.sim.batcher import BatchPolicy, serve_loop
    from deepgap.serving.sim.clock import VirtualClock
    from deepgap.serving.sim.simulator import ServiceModel, simulate

    policy = BatchPolicy(4, 0.0005)
    service = ServiceModel.from_function(lambda b: 2e-4 + 1e-4 * b, [1, 2, 4], padding="bucket")
    times = arr.poisson(2000.0, 1000, 3)
    clock = VirtualClock()

    def execute(first, count):  # the executor's time is charged to the clock, as compute takes real time
        t = service.median_at(count)
        clock.advance(t)
        return 0.0, t, 0.0

    real = serve_loop(times, policy, clock, execute)
    sim = simulate(times, policy, service, seed=None)
    ratio = real.latency_s.mean() / sim.latency_s.mean()
    assert ratio == pytest.approx(1.0, rel=1e-9) and 1 / 3 <= ratio <= 3
    assert float(real.batch.mean()) == pytest.approx(float(sim.batch.mean()), rel=1e-9)
    wrong = ServiceModel.from_function(lambda b: 1e3 * (2e-4 + 1e-4 * b), [1, 2, 4], padding="bucket")
    assert (
        not 1 / 3 <= real.latency_s.mean() / simulate(times, policy, wrong, seed=None).latency_s.mean() <= 3
    )


def _one_run(path: str, device: str) -> float:
    """One served level and its checks against the simulator; returns measured / predicted mean latency."""
    from deepgap.serving.records.storage import curves_frame, levels_frame, requests
    from deepgap.serving.run.serve_run import run_serve
    from deepgap.serving.run.spec import ServeSpec
    from deepgap.serving.sim.batcher import BatchPolicy
    from deepgap.serving.sim.simulator import ServiceModel, simulate

    policy = BatchPolicy(4, 0.0005)
    spec = ServeSpec(
        model="tinycnn",
        device=device,
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
    intervals = [getattr(e, "interval_s", None) for e in cf["extra"]]
    pipelined = device != "cpu" and all(
        i is not None for i in intervals
    )  # a GPU server: two batches in flight
    service = ServiceModel(
        tuple(int(b) for b in cf["batch_size"]),
        tuple(cf["latency_median_s"]),
        {int(b): s for b, s in zip(cf["batch_size"], cf["samples_s"], strict=True)},
        interval_s=tuple(intervals) if pipelined else None,
        depth=2 if pipelined else 1,
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
    if device != "cpu" and 1 / 3 <= ratio <= 3:  # the mean batch: for a run that kept pace, on the GPU
        assert float(lv["mean_batch"]) == pytest.approx(float(sim.batch.mean()), rel=0.5)  # stored as TEXT
    return float(ratio)
