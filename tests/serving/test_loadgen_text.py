"""``deepgap serve --loadgen`` for a text model: LoadGen's samples carry their lengths, the SUT batches them as
the text server does (one queue per length bucket, each batch padded to its bucket or its longest sample),
and useful tokens are counted apart from padded ones.

Cheap on purpose: the executor runs a fake model on `ThreadStreams` (two batches in flight, as on a GPU) and
records every batch; LoadGen runs a fraction of a second. One serve runs end to end in this process
(`conftest.inprocess_serving`). No wall-clock time is asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import inprocess_serving
from text_serve import loadgen_offline

from deepgap.serving.loadgen.harness import LoadgenRequest
from deepgap.serving.loadgen.sut import drive
from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.seqlen import Padding, parse_seq_len_dist
from deepgap.serving.worker.streams import ThreadStreams
from deepgap.serving.worker.text_executor import TokenExecutor

lg = pytest.importorskip("mlperf_loadgen")

EDGES = (16, 32, 64)


class Recorder:
    """A fake encoder: records each batch's ids and mask, returns one number a row."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def __call__(self, ids, mask=None):
        self.seen.append((ids.clone(), None if mask is None else mask.clone()))
        return ids[:, :1].float()


def _executor(pad: Padding, run: Recorder) -> TokenExecutor:
    return TokenExecutor(run, "cpu", [1, 2, 4, 8], 64, 1000, pad, True, pool_size=32, streams=ThreadStreams())


def test_submit_samples_gathers_each_samples_row_and_length():
    run = Recorder()
    ex = _executor(Padding(EDGES), run)
    lengths = np.arange(1, 33) * 2  # sample s is 2(s+1) tokens long
    ex.set_samples(lengths)
    try:
        tickets = [ex.submit_samples([3, 0, 9]), ex.submit_samples([20, 5]), ex.submit_samples([31])]
        for t in tickets:
            ex.wait(t)
    finally:
        ex.close()
    (a, ma), (b, mb), (c, mc) = run.seen
    assert a.shape == (4, 32) and b.shape == (2, 64) and c.shape == (1, 64)  # batch size × bucket
    assert ma[:3].sum(1).tolist() == [8, 2, 20] and ma[3].sum() == 1  # a batch-padding row: one token
    assert mb.sum(1).tolist() == [42, 12] and mc.sum(1).tolist() == [64]
    torch.testing.assert_close(a[:3], ex.ring[[3, 0, 9]][:, :32])  # each sample's own row
    assert ex.useful_tokens == 8 + 2 + 20 + 42 + 12 + 64 and ex.padded_tokens == 3 * 32 + 2 * 64 + 64


@pytest.mark.parametrize("scenario, qps", [("server", 400.0), ("offline", 2000.0)])
def test_loadgen_batches_text_samples_per_bucket_and_counts_tokens(scenario, qps):
    dist = parse_seq_len_dist("uniform:4:64", 64, 512)
    lengths = dist.draw(32, 0)
    run = Recorder()
    ex = _executor(Padding(EDGES), run)
    served: list[list[int]] = []
    submit = ex.submit_samples
    ex.submit_samples = lambda idx: served.append(list(idx)) or submit(idx)
    req = LoadgenRequest(
        scenario, BatchPolicy(8, 2e-3), qps, 0.5, min_queries=150, min_duration_s=0.1, sample_lengths=lengths
    )
    try:
        res = drive(ex, req)
    finally:
        ex.close()
    assert res.parsed["Scenario"] in ("Server", "Offline") and res.log.n >= 150
    assert len(served) == len(run.seen) == res.complete_calls and res.complete_calls < res.log.n
    pad = Padding(EDGES)
    for idx, (ids, mask) in zip(served, run.seen, strict=True):
        lens = lengths[idx]
        assert len(set(pad.bucket_index(lens).tolist())) == 1  # one bucket a batch
        assert (
            ids.shape[1] == pad.pad_to(int(lens.max())) and mask[: len(idx)].sum(1).tolist() == lens.tolist()
        )
    useful = sum(int(lengths[i].sum()) for i in served)
    padded = sum(len(i) * pad.pad_to(int(lengths[i].max())) for i in served)
    assert res.log.useful_tokens == useful and res.log.padded_tokens == padded > useful
    assert res.level.useful_tokens_per_s > 0 and res.level.padded_tokens_per_s > res.level.useful_tokens_per_s
    # the log is back in LoadGen's issue order: matched sample by sample with its trace
    assert res.agreement is not None and res.agreement.matched and res.agreement.n == res.log.n
    assert np.all(res.log.done_s >= res.log.dispatch_s) and np.all(res.log.dispatch_s >= res.log.arrival_s)


def test_serve_tinybert_with_loadgen_stores_tokens_beside_loadgens_verdict(tmp_path, monkeypatch):
    inprocess_serving(monkeypatch)
    out, lgv = loadgen_offline(str(tmp_path / "t.sqlite"), "buckets:16,32,64")
    assert out["loadgen"]["Scenario"] == "Offline" and out["loadgen"]["Result is"] in ("VALID", "INVALID")
    assert len(lgv) == 1 and lgv["useful_tokens_per_s"].iloc[0] > 0
    assert lgv["padded_tokens_per_s"].iloc[0] > lgv["useful_tokens_per_s"].iloc[0]
    assert lgv["padding"].iloc[0] == "buckets:16,32,64"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device machine)")
def test_loadgen_text_samples_on_cuda_streams_match_each_sample_alone():
    """LoadGen drives tinybert on CUDA streams (two batches in flight, staging buffers reused): every batch's
    output is each of its samples' output alone, unpadded, in fp32 on the CPU."""
    from deepgap.measure.models.build import build_model

    cpu = build_model("tinybert", 64, None, 0).eval()
    gpu = build_model("tinybert", 64, None, 0).cuda().eval()
    lengths = parse_seq_len_dist("uniform:4:64", 64, 512).draw(32, 1)
    outs: list[tuple[list[int], torch.Tensor]] = []
    ex = TokenExecutor(gpu, "cuda", [1, 2, 4, 8], 512, 1000, Padding(EDGES), True, pool_size=32)
    submit, wait = ex.submit_samples, ex.wait
    pending: dict[int, list[int]] = {}

    def record_submit(idx):
        t = submit(idx)
        pending[id(t)] = list(idx)
        return t

    def record_wait(t):
        parts = wait(t)
        if id(t) in pending:
            outs.append((pending.pop(id(t)), ex.host_out[t.slot][t.bucket].float().clone()))
        return parts

    ex.submit_samples, ex.wait = record_submit, record_wait
    req = LoadgenRequest(
        "offline",
        BatchPolicy(8, 2e-3),
        4000.0,
        0.5,
        min_queries=200,
        min_duration_s=0.1,
        sample_lengths=lengths,
    )
    with torch.inference_mode():
        res = drive(ex, req)
        alone = torch.cat([cpu(ex.ring[s : s + 1, : lengths[s]].cpu()) for s in range(32)])
    ex.close()
    assert res.log.n >= 200 and len(outs) == res.complete_calls
    for idx, got in outs:
        torch.testing.assert_close(got[: len(idx)], alone[idx], rtol=1e-3, atol=1e-4)
    assert res.log.padded_tokens > res.log.useful_tokens > 0
