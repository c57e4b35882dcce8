"""``deepgap serve`` for text models: lengths, padding (longest, buckets), the masked model, tokens counted.

Cheap on purpose: the batcher and the simulator run on virtual clocks, the executor on `ThreadStreams` with a
fake model, tinybert's mask on a handful of rows; one serve runs end to end in this process
(`conftest.inprocess_serving`) with a few hundred requests. No wall-clock times are asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clirun import deepgap_cli
from conftest import inprocess_serving
from text_serve import find_capacity

from deepgap.core.errors import UsageError
from deepgap.serving.run.spec import ServeSpec, validate
from deepgap.serving.show.tables import text_levels
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.clock import VirtualClock
from deepgap.serving.sim.queues import serve_queues
from deepgap.serving.sim.seqlen import (
    Padding,
    calibration_lengths,
    parse_padding,
    parse_seq_len_dist,
    queue_order,
)
from deepgap.serving.sim.simulator import ServiceModel, simulate
from deepgap.serving.sim.text_service import TextService
from deepgap.serving.worker.streams import ThreadStreams
from deepgap.serving.worker.text_executor import TokenExecutor
from deepgap.store import Store


def test_length_distributions_parse_draw_seeded_and_refuse_bad_specs():
    u = parse_seq_len_dist("uniform:16:128", 128, 512)
    a, b = u.draw(1000, 3), u.draw(1000, 3)
    assert (a == b).all() and a.min() >= 16 and a.max() <= 128 and len(set(a)) > 50
    assert (parse_seq_len_dist(None, 128, 512).draw(5, 0) == 128).all()  # the default: the model's length
    c = parse_seq_len_dist("32:3,128:1", 128, 512)
    share = (c.draw(4000, 0) == 32).mean()
    assert 0.7 < share < 0.8 and c.label() == "32:3,128:1" and c.mean() == 56
    for bad, needle in (
        ("uniform:16", "malformed"),
        ("uniform:64:16", "64 > 16"),
        ("fixed:600", "outside the model's 1..512"),
        ("fixed:x", "not a length"),
        ("32:0,64", "a weight must be a positive number, got '0'"),
        ("32:x,64", "a weight must be a positive number, got 'x'"),
        ("32,32", "twice"),
        ("32:1e308,64:1e308", "the weights add up past any number"),  # a traceback in the draw, once
    ):
        with pytest.raises(UsageError, match=needle):
            parse_seq_len_dist(bad, 128, 512)
    with pytest.raises(UsageError, match="fit no bucket"):
        parse_padding("buckets:32,64", u)
    with pytest.raises(UsageError, match="unknown --padding"):
        parse_padding("shortest", u)
    assert parse_padding("buckets:128,32,64", u).edges == (32, 64, 128)
    assert calibration_lengths(u, Padding((32, 64, 128, 256))) == (32, 64, 128)  # only buckets in use
    assert calibration_lengths(u, Padding()) == (16, 53, 91, 128)


def test_queue_order_puts_each_bucket_together_in_arrival_order():
    lengths = np.asarray([100, 10, 40, 20, 120, 33])
    order, starts = queue_order(lengths, Padding((32, 64, 128)))
    assert order.tolist() == [1, 3, 2, 5, 0, 4] and starts == (0, 2, 4)
    assert queue_order(lengths, Padding())[1] == (0,)


class Recorder:
    """A serial executor on a virtual clock: each batch takes 1 ms; it records the batches."""

    depth = 1

    def __init__(self, clock):
        self.clock, self.batches = clock, []

    def submit(self, first, count):
        self.batches.append((first, count))
        self.clock.sleep_until(self.clock.now() + 0.001)
        return self.clock.now()

    def done(self, t):
        return True

    def wait(self, t):
        return 0.0, 0.001, 0.0, 0.0


def test_bucketed_batches_hold_one_bucket_each_and_serve_every_request_once():
    rng = np.random.default_rng(1)
    arrivals = np.sort(rng.uniform(0, 0.2, 400))
    lengths = rng.integers(1, 129, 400)
    pad = Padding((32, 64, 128))
    order, starts = queue_order(lengths, pad)
    clock = VirtualClock()
    ex = Recorder(clock)
    log = serve_queues(arrivals[order], starts, BatchPolicy(8, 0.002), clock, ex)
    assert log.n == 400 and sum(c for _, c in ex.batches) == 400
    bucket = pad.bucket_index(lengths[order])
    assert all(len(set(bucket[f : f + c])) == 1 for f, c in ex.batches)  # one bucket per batch
    assert max(c for _, c in ex.batches) <= 8 and (log.dispatch_s >= log.arrival_s).all()
    # one queue is the images' loop
    clock2 = VirtualClock()
    one = serve_queues(arrivals, (0,), BatchPolicy(8, 0.002), clock2, Recorder(clock2))
    assert one.n == 400


def _text_service(pad, dist):
    curves = {
        v: ServiceModel.from_function(lambda b, v=v: 1e-4 * b * v, (1, 2, 4, 8), "bucket")
        for v in (32, 64, 128)
    }
    return TextService(curves, dist, pad, seed=0)


def test_simulator_counts_useful_and_padded_tokens_and_charges_padded_lengths():
    dist = parse_seq_len_dist("10:1,60:1,100:1", 128, 512)
    arrivals = np.linspace(0, 1.0, 300)
    lengths = dist.draw(300, 0)
    buckets = _text_service(Padding((32, 64, 128)), dist)
    log = simulate(arrivals, BatchPolicy(4, 0.001), buckets, seed=None)
    assert log.n == 300 and log.useful_tokens == int(lengths.sum())
    assert log.padded_tokens == int(sum(Padding((32, 64, 128)).pad_to(int(v)) for v in lengths))
    fixed = parse_seq_len_dist("fixed:64", 128, 512)
    flog = simulate(arrivals, BatchPolicy(4, 0.001), _text_service(Padding(), fixed), seed=None)
    assert flog.useful_tokens == flog.padded_tokens == 300 * 64
    # a batch of 4 padded to 96 takes the interpolation between the 64- and 128-token curves
    assert buckets.time_at(4, 96)[0] == pytest.approx(1e-4 * 4 * 96)
    assert buckets.saturation_qps(8) > 0 and buckets.median_at(3) == buckets.median_at(4)


def test_tinybert_mask_leaves_tokens_unchanged_and_ignores_padding():
    from deepgap.measure.models.build import build_model

    torch.manual_seed(0)
    model = build_model("tinybert", 16, None, 0).eval()
    ids = torch.randint(1, 1000, (3, 16))
    lens = torch.tensor([16, 9, 4])
    mask = torch.arange(16)[None, :] < lens[:, None]
    with torch.inference_mode():
        plain = model(ids)
        torch.testing.assert_close(model(ids, torch.ones_like(mask)), plain)  # all-ones: the unpadded path
        padded = model(ids, mask)
        alone = torch.cat([model(ids[i : i + 1, : lens[i]]) for i in range(3)])
    torch.testing.assert_close(padded, alone, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(plain[2], alone[2], atol=1e-3)  # without the mask, padding changes the output


def test_token_executor_pads_each_batch_and_pipelines_on_two_streams():
    seen = []

    def run(ids, mask=None):
        seen.append((ids.clone(), None if mask is None else mask.clone()))
        return ids[:, :1].float()

    ex = TokenExecutor(
        run, "cpu", [2, 4], 32, 1000, Padding((8, 16, 32)), True, pool_size=6, streams=ThreadStreams()
    )
    lengths = np.asarray([3, 7, 5, 12, 30, 2, 16])
    ex.set_level(lengths)
    try:
        tickets = [ex.submit(0, 3), ex.submit(3, 2), ex.submit(5, 2)]
        for t in tickets:
            ex.wait(t)
    finally:
        ex.close()
    (a, ma), (b, mb), (c, mc) = seen
    assert a.shape == (4, 8) and b.shape == (2, 32) and c.shape == (2, 16)  # batch size × bucket
    assert ma[:3].sum(1).tolist() == [3, 7, 5] and ma[3].sum() == 1  # a batch-padding row: one token
    assert mb.sum(1).tolist() == [12, 30] and mc.sum(1).tolist() == [2, 16]
    torch.testing.assert_close(c, ex.ring[[5, 0]][:, :16])  # request 6 wraps to ring row 0
    assert ex.useful_tokens == int(lengths.sum()) and ex.padded_tokens == 3 * 8 + 2 * 32 + 2 * 16


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"tenants": (("tinybert", None), ("tinycnn", None))}, "--tenants does not serve text"),
        ({"engine": "cudagraph"}, "eager engine only"),
        ({"model": "llama-tiny", "padding": "buckets:32"}, "--padding does not apply to serving a decoder"),
        ({"seq_len_dist": "uniform:16:1024"}, "outside the model's 1..512"),
        ({"padding": "buckets:32"}, "fit no bucket"),
        ({"model": "tinycnn", "seq_len_dist": "fixed:16"}, "applies to text models"),
    ],
)
def test_text_serve_refuses_what_it_does_not_do_in_one_line(changes, needle):
    spec = ServeSpec(model="tinybert", device="cpu", qps=10.0).replace(**changes)
    with pytest.raises(UsageError, match=needle):
        validate(spec)


def test_serve_tinybert_finds_capacity_with_buckets_and_stores_tokens(tmp_path, monkeypatch):
    inprocess_serving(monkeypatch)
    store = str(tmp_path / "t.sqlite")
    out = find_capacity(store, "buckets:16,32,64")
    assert out["capacity_qps"] > 0 and out["capacity_predicted_qps"] > 0
    assert out["useful_tokens_per_s"] > 0 and out["padded_tokens_per_s"] >= out["useful_tokens_per_s"]
    assert 0 < out["padding_fraction"] < 1 and out["padding"] == "buckets:16,32,64"
    s = Store(store, readonly=True)
    try:
        t = text_levels(s)
    finally:
        s.close()
    assert len(t) and (t["padded_tokens_per_s"] >= t["useful_tokens_per_s"]).all()
    assert (t["predicted_useful_tokens_per_s"] > 0).all() and set(t["seq_len_dist"]) == {"8:2,24:1,60:1"}
    shown = deepgap_cli("show", store)
    assert (
        shown.returncode == 0 and "useful tokens/s" in shown.stdout and "serving text models" in shown.stdout
    )
    from deepgap.serving.show.report_section import section

    found, _ = section(store)
    assert len(found["serving_text"]) == len(t) and "serving_text" in found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device machine)")
def test_token_executor_on_cuda_streams_matches_each_request_alone():
    """Two batches in flight on CUDA streams, padded to their buckets and masked: each request's output is its
    output alone, unpadded, in fp32 on the CPU (a missing stream wait or a wrong mask shows up here)."""
    from deepgap.measure.models.build import build_model

    cpu = build_model("tinybert", 64, None, 0).eval()
    ex = TokenExecutor(
        build_model("tinybert", 64, None, 0).cuda().eval(),
        "cuda",
        [4, 8],
        512,
        1000,
        Padding((16, 32, 64)),
        True,
        pool_size=16,
    )
    lengths = np.asarray([5, 30, 64, 12, 16, 2, 40, 33])
    ex.set_level(lengths)
    with torch.inference_mode():
        tickets = [ex.submit(0, 4), ex.submit(4, 4)]
        got = []
        for t in tickets:
            ex.wait(t)
            got.append(ex.host_out[t.slot][t.bucket][:4].float().clone())
        alone = torch.cat([cpu(ex.ring[k : k + 1, : lengths[k]].cpu()) for k in range(8)])
    ex.close()
    torch.testing.assert_close(torch.cat(got), alone, rtol=1e-3, atol=1e-4)
    assert ex.useful_tokens == int(lengths.sum()) and ex.padded_tokens == 4 * 64 + 4 * 64
