"""A decode GEMV's tiles timed on weights streamed from HBM (`quant.streamed`, ``DEEPGAP_GEMV_TUNE=streamed``).

The tuner (`gemv.fastest`) times each candidate as 20 calls in a CUDA graph; streamed, the calls cycle through
copies of the matrix that together fill twice the L2, so none reads its weights from L2. Here the graph timer is
a stand-in that records which matrix each call was given.
"""

from types import SimpleNamespace

import pytest
import torch

from deepgap.core.errors import UsageError
from deepgap.measure.quant import gemv, streamed

MB = 2**20
KEY = (1, 32, 64, "cuda:0")  # one row, K 32, N 64


@pytest.mark.parametrize(
    "nbytes, copies",
    [
        (4096 * 6144, 5),  # qkv at the 8B shape in fp8: 24 MB
        (4096 * 4096, 7),  # o: 16 MB
        (14336 * 4096, 2),  # down: 56 MB
        (28672 * 4096, 1),  # gate_up: 112 MB, over twice the L2 alone
        (1, streamed.MAX_COPIES),  # a tiny matrix: capped
        (0, streamed.MAX_COPIES),
    ],
)
def test_copies_fill_twice_the_l2(nbytes, copies):
    assert streamed.copies_needed(nbytes, 50 * MB) == copies
    if copies < streamed.MAX_COPIES:  # the fewest that fill it
        assert copies * nbytes >= 2 * 50 * MB > (copies - 1) * nbytes or copies == 1


def test_streamed_copies_hold_the_matrix_in_storage_of_their_own():
    w = torch.arange(12, dtype=torch.int8).reshape(3, 4)
    ws = streamed.streamed_copies(w)  # a CPU tensor: Hopper's 50 MB assumed
    assert len(ws) == streamed.MAX_COPIES and ws[0] is w
    assert all(torch.equal(c, w) for c in ws)
    assert len({c.data_ptr() for c in ws}) == len(ws)


def _tune(monkeypatch, mode: str | None):
    """`gemv.fastest` on a stand-in CUDA device: which matrix each timed call of each candidate was given."""
    if mode is None:
        monkeypatch.delenv("DEEPGAP_GEMV_TUNE", raising=False)
    else:
        monkeypatch.setenv("DEEPGAP_GEMV_TUNE", mode)
    monkeypatch.setattr(gemv, "_TUNED", {})
    monkeypatch.setattr(gemv, "timed_under_pdl", lambda device: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    given: dict = {}

    def fake_ms(launch, calls: int = 20) -> float:
        for i in range(calls):
            launch(i)
        t = launch.__defaults__[0]
        return {4: 2.0, 8: 1.0}[t.bn]

    monkeypatch.setattr(gemv, "_graph_ms", fake_ms)
    w = torch.zeros(64, 32, dtype=torch.int8)
    cands = [gemv.GemvTile(4, 32), gemv.GemvTile(8, 32)]
    best = gemv.fastest(
        KEY, SimpleNamespace(type="cuda"), cands, lambda t, m: given.setdefault(t.bn, []).append(m), weights=w
    )
    return w, best, given


def test_cached_times_every_call_on_the_one_matrix(monkeypatch):
    w, best, given = _tune(monkeypatch, None)
    assert best == gemv.GemvTile(8, 32)
    assert all(m is w for calls in given.values() for m in calls) and len(given[4]) == 21  # a build, 20 timed
    assert gemv.chosen() == "1 row(s) 32x64: 8x32 s1 w4 st4"


def test_streamed_cycles_each_candidates_calls_through_the_copies(monkeypatch):
    w, best, given = _tune(monkeypatch, "streamed")
    assert best == gemv.GemvTile(8, 32)
    for calls in given.values():
        timed = calls[1:]  # the first call builds the candidate
        assert len({m.data_ptr() for m in timed}) == streamed.MAX_COPIES
        assert [m.data_ptr() for m in timed[: streamed.MAX_COPIES]] == [m.data_ptr() for m in timed[8:16]]
        assert all(torch.equal(m, w) for m in timed)
    assert gemv.chosen() == (
        "1 row(s) 32x64: 8x32 s1 w4 st4 (timed on weights streamed from HBM: DEEPGAP_GEMV_TUNE=streamed)"
    )
    monkeypatch.setattr(gemv, "_TUNED", {("linear",): "a fused Linear's tile"})
    assert gemv.chosen() == ""  # no GEMV tile timed: nothing to label


def test_a_bad_value_names_the_switch(monkeypatch):
    monkeypatch.setenv("DEEPGAP_GEMV_TUNE", "hbm")
    with pytest.raises(UsageError, match="DEEPGAP_GEMV_TUNE"):
        streamed.streaming()


@pytest.mark.gpu
def test_on_a_gpu_streamed_tuning_picks_a_tile_that_gives_the_cached_ones_rows(monkeypatch):
    """qkv's shape at 8B (4096 → 6144, fp8) with its norm folded: the tuner on streamed copies (5 at a 50 MB
    L2) picks a candidate, the row says so, and the chosen tile's output is the reference's within bf16."""
    from deepgap.measure.quant.gemv_fused import Fusion, fused_gemv, reference

    monkeypatch.setenv("DEEPGAP_GEMV_TUNE", "streamed")
    monkeypatch.setattr(gemv, "_TUNED", {})
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    k, n = 4096, 6144
    codes = (torch.randn(n, k, device=dev, generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
    scale, x = torch.rand(n, device=dev, generator=g) / 40, torch.randn(1, k, device=dev).bfloat16()
    fusion = Fusion((torch.rand(k, device=dev, generator=g) + 0.5).bfloat16(), 1e-5)
    before = torch.cuda.memory_allocated(dev)
    got = fused_gemv(x, codes, scale, fusion)  # the first call tunes (`gemv_fused._tuned`)
    assert torch.cuda.memory_allocated(dev) - before < codes.nbytes  # the copies are freed after tuning
    assert gemv.chosen().endswith("(timed on weights streamed from HBM: DEEPGAP_GEMV_TUNE=streamed)")
    torch.testing.assert_close(got.float(), reference(x, codes, scale, fusion).float(), rtol=2**-7, atol=2e-2)
