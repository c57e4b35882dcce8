"""The serving data path on the CPU: the uint8 ring, device normalisation, the two-stream pipeline
(threads standing in for CUDA streams), the pipelined event loop and its two-stage simulator, and a
bounded queue under overload."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepgap.serving.sim.batcher import BatchPolicy, StopRule, serve_loop
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.log import summarize
from deepgap.serving.sim.simulator import ServiceModel, simulate
from deepgap.serving.worker.ring import InputRing, Normaliser, spans
from deepgap.serving.worker.server import PipelinedExecutor, pipelined_interval_s, run_level
from deepgap.serving.worker.streams import ThreadStreams


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 64), first=st.integers(0, 10_000), data=st.data())
def test_a_batch_is_one_or_two_contiguous_pieces_covering_its_requests(size, first, data):
    count = data.draw(st.integers(1, size))
    pieces = spans(first, count, size)
    assert 1 <= len(pieces) <= 2 and pieces[0][1] == 0
    slots = [r + i for r, _, n in pieces for i in range(n)]
    assert slots == [(first + k) % size for k in range(count)]
    assert sum(n for *_, n in pieces) == count
    if len(pieces) == 2:  # only a batch that runs past the ring's end wraps
        assert pieces[0][0] + pieces[0][2] == size and pieces[1][0] == 0


def test_a_batch_larger_than_the_ring_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        spans(0, 9, 8)


def test_ring_copy_equals_gathering_each_request():
    ring = InputRing(5, 4, seed=3)
    dst = torch.zeros(4, 4, 4, 3, dtype=torch.uint8)
    assert ring.copy_batch(dst, 13, 4) == 2  # slots 3, 4, 0, 1
    assert torch.equal(dst, ring.images[[3, 4, 0, 1]])
    assert ring.nbytes(4) == 4 * 4 * 4 * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_normalisation_matches_the_fp32_reference_in_the_engines_layout(dtype):
    ring = InputRing(3, 8, seed=1)
    norm = Normaliser(dtype, "cpu")
    out = torch.empty(4, 3, 8, 8, dtype=dtype).contiguous(memory_format=torch.channels_last)
    norm(ring.images, out)
    ref = norm.reference(ring.images)
    assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out[:3].float(), ref, atol=tol * 3, rtol=tol)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(ref, (ring.images.permute(0, 3, 1, 2).float() / 255 - mean) / std)


class SlowRing(InputRing):
    """Copies that take time, so a missing wait between streams would let a slot be overwritten."""

    def copy_batch(self, dst, first, count, non_blocking=False):
        time.sleep(0.002)
        return super().copy_batch(dst, first, count, non_blocking)


def _executor(depth=2, engine_sleep=0.0, size=7, res=4, buckets=(1, 2, 4)):
    ring = SlowRing(size, res, seed=5)
    seen: list[torch.Tensor] = []

    def run(x):
        time.sleep(engine_sleep)
        seen.append(x.clone())
        return x.sum(dim=(2, 3))  # (n, 3) "logits"

    ex = PipelinedExecutor(
        {b: run for b in buckets}, "cpu", torch.float32, True, ring, streams=ThreadStreams(), depth=depth
    )
    return ex, ring, seen


def test_pipelined_batches_see_their_own_requests_with_two_streams():
    ex, ring, seen = _executor(depth=2, engine_sleep=0.003)
    batches = [(0, 4), (4, 3), (7, 1), (8, 2), (10, 4), (14, 4), (18, 3)]
    try:
        tickets = []
        for first, count in batches:
            if len(tickets) >= ex.depth:
                ex.wait(tickets.pop(0))
            tickets.append(ex.submit(first, count))
        for t in tickets:
            ex.wait(t)
    finally:
        ex.close()
    assert len(seen) == len(batches)
    for (first, count), x in zip(batches, seen, strict=True):
        idx = [(first + k) % ring.size for k in range(count)]
        torch.testing.assert_close(x[:count], ex.norm.reference(ring.images[idx]))


def test_copy_in_of_the_next_batch_overlaps_compute_of_the_current():
    ex, _, _ = _executor(depth=2, engine_sleep=0.05)
    try:
        t1, t2 = ex.submit(0, 4), ex.submit(4, 4)
        ex.wait(t1)
        ex.wait(t2)
        copy2_start, compute1_end = t2.events[0].result(), t1.events[3].result()
        compute2_start = t2.events[2].result()
        h2d, compute, d2h, host = ex.wait(t2)
    finally:
        ex.close()
    assert copy2_start < compute1_end  # the second batch's copy did not wait for the first's compute
    assert compute2_start >= compute1_end  # but its compute did: one compute stream, in order
    assert compute >= 0.05 and h2d > 0 and d2h >= 0 and host >= 0


def test_depth_one_is_serial_and_the_slot_is_reused_only_after_its_compute():
    ex, _, _ = _executor(depth=1, engine_sleep=0.01)
    try:
        t1 = ex.submit(0, 2)
        t2 = ex.submit(2, 2)  # same slot: its copy must wait for batch 1's normalise + engine
        ex.wait(t2)
        assert t2.events[0].result() >= t1.events[3].result()
    finally:
        ex.close()


def test_pipeline_errors_surface_on_the_host():
    ring = InputRing(4, 4)

    def broken(x):
        raise RuntimeError("engine exploded")

    ex = PipelinedExecutor({2: broken}, "cpu", torch.float32, False, ring, streams=ThreadStreams(), depth=2)
    try:
        with pytest.raises(RuntimeError, match="engine exploded"):
            ex(0, 2)
    finally:
        ex.close()


def test_real_pipelined_level_serves_every_request_in_order():
    ex, _, _ = _executor(depth=2, engine_sleep=0.001)
    try:
        arrivals = np.sort(np.random.default_rng(0).uniform(0, 0.15, 120))
        log = run_level(ex, arrivals, BatchPolicy(4, 0.002))
        assert pipelined_interval_s(ex, 4, 4) > 0
    finally:
        ex.close()
    assert log.n == 120 and log.n_dropped == 0
    np.testing.assert_array_equal(log.arrival_s, arrivals)
    assert (log.dispatch_s >= log.arrival_s - 1e-9).all() and (log.done_s > log.dispatch_s).all()
    assert log.host_s is not None and (log.host_s > 0).all()
    assert summarize(log, None).host_mean_s > 0


def test_two_stage_simulator_runs_at_the_interval_and_serially_at_the_latency():
    arrivals = np.zeros(400)
    pol = BatchPolicy(4, 0.0)
    serial = ServiceModel((4,), (0.010,), padding="bucket")
    piped = ServiceModel((4,), (0.010,), padding="bucket", interval_s=(0.006,), depth=2)
    s1 = summarize(simulate(arrivals, pol, serial, seed=None), None)
    s2 = summarize(simulate(arrivals, pol, piped, seed=None), None)
    assert s1.achieved_qps == pytest.approx(4 / 0.010, rel=1e-6)
    assert s2.achieved_qps == pytest.approx(4 / 0.006, rel=0.01)
    assert piped.saturation_qps(4) == pytest.approx(4 / 0.006)
    one = simulate(np.array([0.0, 1.0]), pol, piped, seed=None)  # alone, a batch takes its full latency
    np.testing.assert_allclose(one.latency_s, [0.010, 0.010])


def test_overload_drops_requests_from_a_bounded_queue_and_reports_them():
    sv = ServiceModel((1, 4), (0.001, 0.002), padding="bucket", interval_s=(0.0008, 0.0015), depth=2)
    rate = 1.2 * sv.saturation_qps(4)
    arrivals = np.cumsum(np.random.default_rng(1).exponential(1 / rate, 6000))
    slo = 0.010
    log = simulate(arrivals, BatchPolicy(4, 0.0), sv, stop=StopRule(slo_s=slo, drop_after_s=slo))
    s = summarize(log, rate, slo)
    assert s.n_dropped > 0 and s.n + s.n_dropped == len(arrivals) and s.verdict == "fail"
    assert log.queue_s.max() <= slo + 1e-12  # no request waited longer than the bound
    assert s.achieved_qps == pytest.approx(sv.saturation_qps(4), rel=0.05)  # it keeps serving at its pace
    unbounded = simulate(arrivals, BatchPolicy(4, 0.0), sv, stop=StopRule(slo_s=slo))
    assert unbounded.queue_s.max() > 10 * slo  # without the bound the queue grows for the whole run


def test_sync_executor_keeps_the_serial_loop_semantics():
    clock = VirtualClock()

    def execute(first, n):
        clock.advance(0.1)
        return 0.0, 0.1, 0.0

    log = serve_loop([0.0, 0.05, 0.5], BatchPolicy(2, 0.0), clock, execute)
    np.testing.assert_allclose(log.done_s, [0.1, 0.2, 0.6])
    np.testing.assert_array_equal(log.batch, [1, 1, 1])
    np.testing.assert_allclose(log.dispatch_s, [0.0, 0.1, 0.5])
