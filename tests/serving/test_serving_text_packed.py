"""``deepgap serve --padding packed``: a text batch served with its padding removed (issue 50, MLPerf BERT's
Server condition).

The flag, the simulator's charge (a packed batch costs its tokens' work: the calibrated length equal to its
tokens over its rows), the executor on tinybert against each request alone, and one serve end to end in this
process with useful tokens equal to computed ones. Virtual clocks and `ThreadStreams`; no wall-clock assert.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import inprocess_serving
from text_serve import find_capacity, loadgen_offline

from deepgap.serving.sim.batcher import BatchPolicy
from deepgap.serving.sim.seqlen import Padding, parse_padding, parse_seq_len_dist
from deepgap.serving.sim.simulator import ServiceModel, simulate
from deepgap.serving.sim.text_service import TextService
from deepgap.serving.worker.streams import ThreadStreams
from deepgap.serving.worker.text_executor import TokenExecutor


def test_the_flag_and_the_effective_length():
    dist = parse_seq_len_dist("uniform:8:64", 128, 512)
    pad = parse_padding("packed", dist)
    assert pad.packed and pad.mode == "packed" and pad.label() == "packed" and not pad.edges
    assert pad.pad_to(40) == 40  # its longest: attention's bound, one queue as with longest
    # 3 requests of 10, 20, 30 tokens in a batch of 4 rows: 60 tokens and one 1-token padding row, over 4 rows
    assert pad.effective_len(np.asarray([10, 20, 30]), 4) == pytest.approx(61 / 4)
    assert Padding().effective_len(np.asarray([10, 20, 30]), 4) == 30.0
    assert Padding((16, 32, 64)).effective_len(np.asarray([10, 20]), 2) == 32.0


def test_the_simulator_charges_a_packed_batch_its_tokens_and_pads_nothing():
    dist = parse_seq_len_dist("10:1,60:1,100:1", 128, 512)
    curves = {
        v: ServiceModel.from_function(lambda b, v=v: 1e-4 * b * v, (1, 2, 4, 8), "bucket")
        for v in (10, 60, 100)
    }
    packed = TextService(curves, dist, Padding(packed=True), seed=0)
    longest = TextService(curves, dist, Padding(), seed=0)
    arrivals = np.linspace(0, 1.0, 300)
    log = simulate(arrivals, BatchPolicy(4, 0.001), packed, seed=None)
    assert log.n == 300 and log.useful_tokens == log.padded_tokens == int(dist.draw(300, 0).sum())
    # a batch's time is the curve's at its tokens over its rows, below the padded batch's at its longest
    assert packed.median_at(4) < longest.median_at(4)
    assert packed.saturation_qps(8) > longest.saturation_qps(8)


def test_the_executor_packs_each_batch_and_matches_each_request_alone():
    """Two batches (one with a batch-padding row) on two streams: each request's output is its output alone."""
    from deepgap.measure.models.build import build_model

    model = build_model("tinybert", 64, None, 0).eval()
    pad = Padding(packed=True)
    ex = TokenExecutor(model, "cpu", [2, 4], 64, 1000, pad, True, pool_size=8, streams=ThreadStreams())
    lengths = np.asarray([3, 64, 17, 9, 40])
    ex.set_level(lengths)
    got = []
    with torch.inference_mode():
        try:
            for t in [ex.submit(0, 3), ex.submit(3, 2)]:
                ex.wait(t)
                got.append(ex.host_out[t.slot][t.bucket][: t.bucket].float().clone())
        finally:
            ex.close()
        alone = torch.cat([model(ex.ring[i : i + 1, :n]) for i, n in enumerate(lengths)])
    torch.testing.assert_close(torch.cat([got[0][:3], got[1][:2]]), alone, rtol=1e-5, atol=1e-5)
    assert ex.useful_tokens == ex.padded_tokens == int(lengths.sum())


def test_serve_tinybert_packed_finds_capacity_and_pads_nothing(tmp_path, monkeypatch):
    inprocess_serving(monkeypatch)
    store = str(tmp_path / "p.sqlite")
    out = find_capacity(store, "packed")
    assert out["capacity_qps"] > 0 and out["capacity_predicted_qps"] > 0 and out["padding"] == "packed"
    assert (
        out["useful_tokens_per_s"] == pytest.approx(out["padded_tokens_per_s"])
        and out["padding_fraction"] == 0
    )
    from deepgap.commands.export import export_frame

    df = export_frame(store)  # the levels and capacities reach `export` (a serve store exported 0 rows)
    cap = df[(df["workload"] == "serve-capacity") & (df["source"] == "measured")]
    assert cap["capacity_qps"].tolist() == [pytest.approx(out["capacity_qps"])]
    lv = df[df["workload"] == "serve"]
    assert len(lv) and (lv["padding"] == "packed").all() and (lv["useful_tokens_per_s"] > 0).any()


def test_loadgen_drives_a_packed_text_server(tmp_path, monkeypatch):
    pytest.importorskip("mlperf_loadgen")  # in the test extras: installed wherever the suite runs
    inprocess_serving(monkeypatch)
    out, lgv = loadgen_offline(str(tmp_path / "l.sqlite"), "packed")
    assert out["loadgen"]["Scenario"] == "Offline" and out["loadgen"]["Result is"] in ("VALID", "INVALID")
    assert len(lgv) == 1 and lgv["padding"].iloc[0] == "packed"
    useful = lgv["useful_tokens_per_s"].iloc[0]
    assert useful > 0 and lgv["padded_tokens_per_s"].iloc[0] == pytest.approx(useful)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device machine)")
def test_packed_batches_on_cuda_streams_match_each_request_alone():
    """Two packed batches in flight on CUDA streams, fp16 (varlen attention): each request's output is its
    output alone, unpadded, in fp32 on the CPU (a layout made on the wrong stream shows up here)."""
    from deepgap.measure.models.build import build_model

    cpu = build_model("tinybert", 64, None, 0).eval()
    gpu = build_model("tinybert", 64, None, 0).cuda().half().eval()
    ex = TokenExecutor(gpu, "cuda", [4, 8], 512, 1000, Padding(packed=True), True, pool_size=16)
    lengths = np.asarray([5, 30, 64, 12, 16, 2, 40, 33])
    ex.set_level(lengths)
    with torch.inference_mode():
        got = []
        for t in [ex.submit(0, 4), ex.submit(4, 4)]:
            ex.wait(t)
            got.append(ex.host_out[t.slot][t.bucket][:4].float().clone())
        alone = torch.cat([cpu(ex.ring[k : k + 1, : lengths[k]].cpu()) for k in range(8)])
    ex.close()
    torch.testing.assert_close(torch.cat(got), alone, rtol=2e-2, atol=2e-2)
    assert ex.useful_tokens == ex.padded_tokens == int(lengths.sum())
