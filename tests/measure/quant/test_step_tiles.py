"""`quant.step_tiles`: the fused GEMVs' tiles timed in the decode step's own graph (``DEEPGAP_GEMV_TUNE=step``).

The search is checked with a stand-in timer on the CPU; the GPU test runs it in llama-tiny's graphed fp8 step.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.quant import gemv, step_tiles
from deepgap.measure.quant.gemv_fused import FUSED_TILES, QKV_TILE, STEP_TILES, Fusion

A, B, C = gemv.GemvTile(8, 2048, 1, 8), gemv.GemvTile(4, 2048, 1, 4), gemv.GemvTile(4, 1024, 1, 4)
QKV0 = ("fused", (True, False, False, True, False, False), 4096, 6144, "cuda:0")  # layer 0: the norm folded
QKV = ("fused", (False, False, False, True, True, False), 4096, 6144, "cuda:0")  # the others: handed over
DOWN = ("fused", (False, False, True, False, False, True), 14336, 4096, "cuda:0")


@pytest.fixture
def fresh(monkeypatch):
    """Empty tables (they are process-wide), and the search switched on."""
    for name, empty in (("CANDIDATES", {}), ("SEARCHED", set()), ("NOTES", [])):
        monkeypatch.setattr(step_tiles, name, empty)
    monkeypatch.setattr(gemv, "_TUNED", {})
    monkeypatch.setenv("DEEPGAP_GEMV_TUNE", "step")


def test_shapes_group_the_keys_of_one_shape_with_the_candidates_all_of_them_take():
    table = {QKV0: (A, B, C, gemv.NORM_TILES[0]), QKV: (A, B, C), DOWN: (B, A)}
    assert step_tiles.shapes(table) == [
        ((14336, 4096), [DOWN], [B, A]),
        ((4096, 6144), [QKV0, QKV], [A, B, C]),
    ]


def test_the_search_keeps_each_shapes_fastest_tile_in_the_step_and_says_so(fresh):
    """A stand-in timer: the step's time as a sum over the tiles the table holds now; a candidate that fails to
    build is passed over; every key of a shape takes the tile; a second search times nothing again."""
    cost = {A: 1.0, B: 0.7, C: 0.5}
    step_tiles.CANDIDATES.update({QKV0: (A, B, C), QKV: (A, B, C), DOWN: (A, B)})
    gemv._TUNED.update({QKV0: A, QKV: A, DOWN: A})
    calls = []

    def timer() -> float:
        calls.append(dict(gemv._TUNED))
        if gemv._TUNED[QKV] == C and gemv._TUNED[DOWN] == B:  # this pair fails to build
            raise RuntimeError("no build")
        return 2.0 + sum(cost[t] for t in gemv._TUNED.values())

    step_tiles.search(timer, gemv._TUNED)
    assert gemv._TUNED == {QKV0: B, QKV: B, DOWN: B}  # down first (the larger shape), then qkv without C
    assert len(calls) == 5 and {QKV0, QKV, DOWN} == step_tiles.SEARCHED
    notes = [
        "14336x4096 4.7000 ms of 2 timed, the tuner's 5.0000",
        "4096x6144 4.1000 ms of 2 timed, the tuner's 4.7000",
    ]
    assert notes == step_tiles.NOTES
    step_tiles.search(timer, gemv._TUNED)
    assert len(calls) == 5
    assert gemv.chosen().endswith(
        "(the fused GEMVs' tiles timed in the step, DEEPGAP_GEMV_TUNE=step: 14336x4096 4.7000 ms of 2 timed, the "
        "tuner's 5.0000; 4096x6144 4.1000 ms of 2 timed, the tuner's 4.7000)"
    )


def test_a_shape_whose_every_candidate_fails_keeps_the_tuners_tiles(fresh):
    """Each key of the shape keeps its own: layer 0's qkv may have chosen another tile than the others."""
    step_tiles.CANDIDATES.update({QKV0: (A, B), QKV: (A, B)})
    gemv._TUNED.update({QKV0: A, QKV: B})

    def timer() -> float:
        raise RuntimeError("no capture")

    step_tiles.search(timer, gemv._TUNED)
    assert gemv._TUNED == {QKV0: A, QKV: B} and step_tiles.NOTES == [] and {QKV0, QKV} == step_tiles.SEARCHED


def test_with_the_search_on_qkv_is_not_pinned_and_every_fused_gemv_offers_the_step_tiles(fresh, monkeypatch):
    """Each fused GEMV's candidates, `gemv_fused.STEP_TILES` (qkv's pin first) among them, reach the search as the
    tuner fits them (`gemv_fused._tuned`, untimed on a CPU: the first candidate)."""
    from deepgap.measure.quant import gemv_fused

    qkv = Fusion(rope=object(), handed=torch.ones(512))
    assert (
        qkv.tiles() == FUSED_TILES + STEP_TILES and STEP_TILES[0] == QKV_TILE and not gemv_fused.qkv_pinned()
    )
    x, codes, scale = (
        torch.zeros(1, 64).bfloat16(),
        torch.zeros(32, 64).to(torch.float8_e4m3fn),
        torch.ones(32),
    )
    residual = Fusion(residual=torch.zeros(1, 32).bfloat16())
    assert gemv_fused._tuned(x, codes, scale, residual) == FUSED_TILES[0].fit(64, 32)
    (key,) = step_tiles.CANDIDATES
    fitted = tuple(dict.fromkeys(t.fit(64, 32) for t in FUSED_TILES + STEP_TILES))
    assert key[2:4] == (64, 32) and step_tiles.CANDIDATES[key] == fitted
    monkeypatch.setenv("DEEPGAP_GEMV_TUNE", "cached")
    assert qkv.tiles() == (QKV_TILE,) and residual.tiles() == FUSED_TILES and step_tiles.label() == ""


@pytest.mark.gpu
def test_on_a_gpu_the_graphed_step_times_its_tiles_and_keeps_a_candidate(fresh):
    """llama-tiny's compiled fp8 graph at batch 1 with the search on: every fused shape searched, each key left at
    one of its candidates, finite logits, and the row's tiles saying what was timed."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from graphed_tiny import fp8_graph_logits

    logits, model = fp8_graph_logits(steps=1)
    fused = [k for k in gemv._TUNED if k[0] == "fused"]
    assert fused and set(fused) <= step_tiles.SEARCHED and step_tiles.NOTES
    assert all(gemv._TUNED[k] in step_tiles.CANDIDATES[k] for k in fused)
    assert torch.isfinite(logits).all() and "timed in the step" in gemv.chosen()
